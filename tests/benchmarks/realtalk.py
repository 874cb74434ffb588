"""REALTALK: the public data of tests/benchmarks/public_recall.py.

REALTALK (Lee, Maharana, Pujara, Ren, Barbieri, 2025, arXiv 2502.13270) is
21 days of real messaging-app conversations between ten pairs of people
(8,944 turns), with 728 memory-probing questions, each annotated with the
turns that answer it ("D3:12": session 3, turn 12). Categories: 1 multi-hop
(the answer is spread over several turns), 2 temporal (when / what at a time),
3 commonsense (an inference from what was said).

Source: github.com/danny911kr/REALTALK at commit SOURCE_COMMIT, the ten
top-level files data/Chat_*.json and nothing else (that repository also
carries a copy of another benchmark under data/locomo/, which this project
must never read: only the names in FILES are ever opened). The repository has
no licence file, so the files are not redistributed here: they are read
where they are, a directory holding them (REALTALK's data/ layout, e.g. a
clone's data/) or a bare git clone of the repository (read at SOURCE_COMMIT). Every file is checked against its
git blob id, so a figure always names exactly the data it was measured on.

Everything but `read_files` is a pure function of the files' contents.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

SOURCE = "github.com/danny911kr/REALTALK"
SOURCE_COMMIT = "b903e06a9770bf4e5fe9018c3e132889666d3b4a"
# file name → git blob id at SOURCE_COMMIT (`git ls-tree SOURCE_COMMIT data/`).
FILES = {
    "Chat_1_Emi_Elise.json": "3a3205c099754dc8e80103d3b6a292f69308cf3f",
    "Chat_2_Kevin_Elise.json": "121bb479785de23c8c14c46cb364dc9415dac81f",
    "Chat_3_Kevin_Paola.json": "cc6603969b914d7cf7c36eec3c4f939e1c57c2d9",
    "Chat_4_Emi_Paola.json": "82c4ce8e090e14613c00bd4338cc4ff1f856fec3",
    "Chat_5_Nicolas_Nebraas.json": "a70204080608ba6923a1ce978dbf846fe19559ab",
    "Chat_6_Vanessa_Nicolas.json": "f58aff66d3a757c12f06bde92c40d20f382e19f3",
    "Chat_7_Nebraas_Vanessa.json": "ef666c493e96b7539d5e6c0764ed9efdf8fe44bc",
    "Chat_8_Akib_Muhhamed.json": "d3b96f06130f254e20a2fea6fd581a4147c2584f",
    "Chat_9_Fahim_Akib.json": "5dabb998f6c208936f11bd35ec3ce5ab96f53eca",
    "Chat_10_Fahim_Muhhamed.json": "ff0d44bae354cd1d892224b5ede6be871d7f5adf",
}
FILES_FIRST = next(iter(FILES))
TYPES = {1: "multi-hop", 2: "temporal", 3: "commonsense"}
# Where to look when no place is given ($REFLECT_REALTALK first): a clone of
# REALTALK beside the checkout, then where this team's machines keep a snapshot.
ROOT = Path(__file__).resolve().parents[2]
PLACES = (ROOT.parent / "REALTALK" / "data", Path("/work/.mirror/danny911kr+REALTALK/repo"))


@dataclass(frozen=True)
class Turn:
    id: str  # "<conversation>-<dia_id>", e.g. "c3-D2:14": unique across conversations
    speaker: str
    text: str  # what an agent would record: "<speaker>: <message>", an image's caption appended
    occurred_at: str  # RFC 3339 (the data has no time zone: taken as UTC)


@dataclass(frozen=True)
class Question:
    id: str
    text: str
    type: str
    evidence: frozenset[str]  # Turn ids


@dataclass(frozen=True)
class Conversation:
    id: str  # "c1" … "c10": also the benchmark's user id for it
    name: str  # the file's name, e.g. "Chat_3_Kevin_Paola"
    turns: tuple[Turn, ...]  # oldest first
    questions: tuple[Question, ...]  # those with at least one evidence turn in `turns`
    dropped_questions: int  # annotated with no evidence that resolves to a turn
    dropped_evidence: int  # evidence ids that name no turn (malformed, or a turn the data left out)


class DataMissing(FileNotFoundError):
    pass


def locate(place: str | os.PathLike | None = None) -> Path:
    """The first place that holds the data: `place`, $REFLECT_REALTALK, PLACES."""
    given = place or os.environ.get("REFLECT_REALTALK")
    for p in ([Path(given)] if given else [Path(p) for p in PLACES]):
        if (p / FILES_FIRST).exists() or _is_git(p):
            return p
    raise DataMissing(
        f"REALTALK not found ({given or ', '.join(map(str, PLACES))}): put the ten data/Chat_*.json files of "
        f"{SOURCE} at commit {SOURCE_COMMIT[:12]} in a directory and pass it (--data or REFLECT_REALTALK), "
        f"or a bare git snapshot of that repository")



def _is_git(path: Path) -> bool:
    return (path / "HEAD").is_file() and (path / "objects").is_dir()


def blob_id(data: bytes) -> str:
    """git's id of a file's contents."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def read_files(place: Path) -> dict[str, bytes]:
    """FILES' contents from a directory or a bare git snapshot, each checked against its blob id."""
    out = {}
    for name, expected in FILES.items():
        if _is_git(place):  # exactly these paths: the snapshot holds data this project must not read
            data = subprocess.run(["git", "--git-dir", str(place), "show", f"{SOURCE_COMMIT}:data/{name}"],
                                  check=True, capture_output=True).stdout
        else:
            data = (place / name).read_bytes()
        if blob_id(data) != expected:
            raise ValueError(f"{place / name}: not the file of {SOURCE} at {SOURCE_COMMIT[:12]} "
                             f"(blob {blob_id(data)[:12]}, want {expected[:12]})")
        out[name] = data
    return out


def load(place: str | os.PathLike | None = None) -> list[Conversation]:
    files = read_files(locate(place))
    return [conversation(f"c{i}", name.removesuffix(".json"), json.loads(files[name]))
            for i, name in enumerate(FILES, 1)]


_SESSION = re.compile(r"session_(\d+)")


def conversation(cid: str, name: str, raw: dict) -> Conversation:
    """One file's turns, oldest first, and its answerable questions."""
    turns = []
    sessions = sorted((int(m.group(1)), key) for key in raw for m in [_SESSION.fullmatch(key)] if m)
    for _, key in sessions:
        for t in raw[key]:
            text = " ".join(t.get("clean_text", "").split())
            caption = (t.get("blip_caption") or "").strip()
            if caption:  # a shared photo: its caption is all the data says of it
                text = f"{text} [photo: {caption}]".strip()
            if text:
                turns.append(Turn(f"{cid}-{t['dia_id']}", t["speaker"], f"{t['speaker']}: {text}",
                                  turn_time(t["date_time"])))
    known = {t.id for t in turns}
    questions, dropped_q, dropped_e = [], 0, 0
    for n, qa in enumerate(raw.get("qa", ())):
        ids = [f"{cid}-{e}" for e in evidence_ids(qa.get("evidence", ()))]
        kept = frozenset(e for e in ids if e in known)
        dropped_e += len(set(ids) - kept)
        if not kept or qa.get("category") not in TYPES:
            dropped_q += 1
            continue
        questions.append(Question(f"{cid}-q{n}", qa["question"], TYPES[qa["category"]], kept))
    return Conversation(cid, name, tuple(turns), tuple(questions), dropped_q, dropped_e)


_ID = re.compile(r"D(\d+):(\d+)")


def evidence_ids(raw: list[str]) -> list[str]:
    """Annotated evidence as dia ids: entries joined by ';' or ',' are split,
    stray punctuation dropped, and a range "D12:3-D12:5" expanded."""
    out = []
    for entry in raw:
        for part in re.split(r"[;,\s]+", entry):
            ends = _ID.findall(part)
            if len(ends) == 2 and "-" in part and ends[0][0] == ends[1][0]:
                session, first, last = ends[0][0], int(ends[0][1]), int(ends[1][1])
                out += [f"D{session}:{i}" for i in range(first, last + 1)]
            else:
                out += [f"D{s}:{i}" for s, i in ends]
    return list(dict.fromkeys(out))


def turn_time(text: str) -> str:
    """"29.12.2023, 22:42:04" → RFC 3339, UTC."""
    return datetime.strptime(text.strip(), "%d.%m.%Y, %H:%M:%S").replace(tzinfo=timezone.utc) \
        .isoformat().replace("+00:00", "Z")
