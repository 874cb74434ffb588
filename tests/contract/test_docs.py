"""The docs a newcomer reads: no link or file name that leads nowhere, and a
README short enough to finish."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# A backticked name that is a file of this repository: a path with a known suffix, or a folder ending in /.
NAMED = re.compile(r"`((?:[\w.-]+/)*[\w.-]+\.(?:py|md|json|yaml|yml|toml|txt|tsv|sh)|(?:[\w.-]+/)+)`")
# Named in the docs on purpose though not in the repository: made at run time, or someone else's.
NOT_OURS = {"deploy/reflect-metrics-token", ".reflect/", "schemathesis-report/", "bench.json",
            "reflect-embedder.json"}  # the last: written into an Edge shard directory (streams/adapters/view/edge.py)


SKIPPED = {".git", ".venv", "venv", "build", "dist", "node_modules", "__pycache__", ".pytest_cache", ".hypothesis"}


def files(pattern: str = "*") -> list[Path]:
    """The repository's files (not a virtual environment's or a build's)."""
    return sorted(p for p in ROOT.rglob(pattern) if p.is_file() and not any(
        part in SKIPPED or part.endswith(".egg-info") for part in p.relative_to(ROOT).parts))


def docs() -> list[Path]:
    return files("*.md")


BASENAMES = {p.name for p in files()}


def _exists(doc: Path, target: str) -> bool:
    """A path from the doc's folder or the root; a bare file name anywhere in the repository."""
    path = target.split("#")[0]
    return (not path or (doc.parent / path).exists() or (ROOT / path).exists()
            or ("/" not in path and path in BASENAMES))


@pytest.mark.parametrize("doc", docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_and_file_name_in_a_doc_exists(doc):
    text = doc.read_text("utf-8")
    links = [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]  # not http:, mailto:
    named = [n for n in NAMED.findall(text) if n not in NOT_OURS and "<" not in n and "*" not in n]
    missing = sorted({t for t in links + named if not _exists(doc, t)})
    assert missing == [], f"{doc.relative_to(ROOT)} names what does not exist: {missing}"


def test_links_to_a_section_name_one_that_exists():
    for doc in docs():
        for target in LINK.findall(doc.read_text("utf-8")):
            if re.match(r"[a-z]+:", target) or "#" not in target:
                continue
            path, anchor = target.split("#", 1)
            linked = (doc.parent / path) if path else doc
            headings = [re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-")
                        for h in re.findall(r"^#+ (.+)$", linked.read_text("utf-8"), re.M)]
            assert anchor in headings, f"{doc.relative_to(ROOT)} links to a missing section: {target}"


def test_the_readme_is_short_enough_to_finish():
    assert len((ROOT / "README.md").read_text("utf-8").splitlines()) <= 200
