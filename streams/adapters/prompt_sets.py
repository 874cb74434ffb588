"""The anthropic reasoner's prompt sets: the packaged one, the one a worker
is told to use (REFLECT_PROMPTS), and a library of others that a replay may
choose by version (REFLECT_PROMPT_LIBRARY, one set per subfolder).

A set is a folder holding exactly the files the reasoner reads; its version
is a hash of them, so beliefs name the words that made them and a replay
under an edited prompt compares prompts by what they said."""

from __future__ import annotations

import hashlib
from pathlib import Path

PACKAGED = Path(__file__).with_name("prompts")
FILES = ("challenge.md", "insights.md", "insights_batch.md", "questions.md")


class PromptSetError(ValueError):
    """A prompt set that is missing, incomplete, or not known by that version."""


def version_of(folder: Path) -> str:
    """`anthropic-` and the first 12 hex digits of a SHA-256 over the set's
    files (name and content, in name order)."""
    digest = hashlib.sha256()
    for name in FILES:
        digest.update(name.encode() + b"\0" + (folder / name).read_bytes() + b"\0")
    return f"anthropic-{digest.hexdigest()[:12]}"


def checked(folder: Path) -> Path:
    """The folder, if it holds every file a set needs."""
    lacking = missing(folder)
    if lacking:
        raise PromptSetError(f"prompt set {folder} lacks {', '.join(lacking)} (a set holds {', '.join(FILES)})")
    return folder


def missing(folder: Path) -> list[str]:
    return [name for name in FILES if not (folder / name).is_file()]


def library_of(settings) -> Path:
    return Path(settings.prompt_library) if settings.prompt_library else Path(settings.data_dir) / "prompts"


def known(settings) -> dict[str, Path]:
    """Every set this worker can use, by version: the packaged one, its own,
    and each complete subfolder of its library."""
    sets = [PACKAGED] + ([Path(settings.prompts)] if settings.prompts else [])
    library = library_of(settings)
    sets += sorted(p for p in library.iterdir() if p.is_dir()) if library.is_dir() else []
    return {version_of(folder): folder for folder in sets if not missing(folder)}


def chosen(settings, wanted: str) -> tuple[str, Path]:
    """The set a replay asked for, by version or by its library folder's name."""
    sets, library = known(settings), library_of(settings)
    for version, folder in sets.items():
        if wanted == version or (folder.parent == library and folder.name == wanted):
            return version, folder
    listed = ", ".join(f"{v} ({f})" for v, f in sets.items())
    raise PromptSetError(f"no prompt set {wanted!r} here; this worker knows {listed} "
                         f"(add one as a folder of {', '.join(FILES)} in {library_of(settings)})")

