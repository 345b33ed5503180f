"""Verifying an audit log: every file of the chain (all rotations and the active file), its HMAC
tags, sequence numbers and links, that it starts at its origin, its checkpoint, and its anchor.

Invariant: `verify_chain` returns only when every line of every file checks under the key and
the chain reaches its checkpoint and its anchor; otherwise it raises `AuditVerifyError` (or
`WrongKey`, when no file was written under this key) naming the first bad file and line.
"""

from __future__ import annotations

import hmac
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from gateway.audit.chain.anchor import Anchor, AnchorError, read_anchor
from gateway.audit.chain.format import (
    GENESIS,
    KINDS,
    chain_tag,
    head_path,
    key_check,
    rotated_paths,
    sealed,
)


class AuditVerifyError(Exception):
    def __init__(self, path: Path, line: int, reason: str) -> None:
        super().__init__(f"{path}:{line}: {reason}")
        self.path, self.line, self.reason = path, line, reason


class WrongKey(AuditVerifyError):
    """Not tampering: the log was written under another key."""


@dataclass(frozen=True, slots=True)
class FileSummary:
    file_id: str
    chain: str
    last_tag: str
    first_seq: int
    lines: int
    records: int
    recoveries: int
    sealed: bool
    origin: bool  # this file starts the chain (its header follows nothing)
    verdicts: Mapping[str, int] = field(default_factory=dict)  # final answer records per verdict
    opened: frozenset[str] = frozenset()  # upstream ids of streams' `open` records
    settled: frozenset[str] = frozenset()  # upstream ids of `final` answer records


def unfinished(summaries: list[FileSummary]) -> int:
    """Streams whose record was opened and never completed in this chain: the gateway stopped
    (a crash, a kill) while they ran, or they are running now. A record that was completed
    and then removed breaks the chain instead."""
    opened = frozenset().union(*(s.opened for s in summaries))
    settled = frozenset().union(*(s.settled for s in summaries))
    return len(opened - settled)


def _entries(path: Path) -> list[dict[str, Any]]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise AuditVerifyError(path, 0, f"cannot read ({exc.strerror})") from exc
    *lines, rest = data.split(b"\n")
    if rest:
        raise AuditVerifyError(
            path, len(lines) + 1, "torn last line (no newline): cut, or a crash while writing "
            "(the gateway recovers that when it starts)",
        )  # fmt: skip
    entries = []
    for number, line in enumerate(lines, 1):
        try:
            entry = orjson.loads(line)
        except orjson.JSONDecodeError:
            entry = None
        if not isinstance(entry, dict) or not isinstance(entry.get("tag"), str):
            raise AuditVerifyError(path, number, "not a tagged JSON record")
        entries.append(entry)
    if not entries:
        raise AuditVerifyError(path, 1, "empty file (no header)")
    return entries


def _check_start(path: Path, header: dict[str, Any], prev: FileSummary | None) -> str:
    start = header.get("prev_tag")
    if header.get("kind") != "header" or header.get("v") != 1:
        raise AuditVerifyError(path, 1, "first line is not a version 1 header")
    if not isinstance(start, str) or len(start) != 64 or start.strip("0123456789abcdef"):
        raise AuditVerifyError(path, 1, "header has no valid prev_tag")
    if prev is not None and (
        header.get("prev_file_id") != prev.file_id
        or not hmac.compare_digest(start, prev.last_tag)
        or not prev.sealed
    ):
        raise AuditVerifyError(path, 1, "does not continue the previous file's chain")
    return start


def verify_file(path: Path, key: bytes, prev: FileSummary | None = None) -> FileSummary:
    entries = _entries(path)
    header = entries[0]
    tag = _check_start(path, header, prev)
    first = prev.first_seq + prev.lines if prev is not None else header.get("seq")
    checked = "key_check" in header
    for number, entry in enumerate(entries, 1):
        if not hmac.compare_digest(chain_tag(key, tag, entry), entry["tag"]):
            what = "edited, inserted, deleted or reordered" if checked else "or a wrong key"
            raise AuditVerifyError(path, number, f"tag mismatch: record {what}")
        kind = entry.get("kind")
        if (kind == "header") != (number == 1) or kind not in KINDS:
            raise AuditVerifyError(path, number, f"unexpected {kind!r} line")
        if kind == "seal" and (number != len(entries) or entry.get("lines") != number):
            raise AuditVerifyError(path, number + 1, "lines after the seal")
        if not isinstance(first, int) or entry.get("seq") != first + number - 1:
            raise AuditVerifyError(path, number, "sequence number out of order")
        tag = entry["tag"]
    kinds = [e.get("kind") for e in entries]
    answers = [e for e in entries if e.get("kind") == "record" and "verdict" in e]
    opened = [e for e in answers if e.get("phase") == "open"]
    final = [e for e in answers if e.get("phase", "final") == "final"]  # older logs: no phase
    return FileSummary(
        file_id=str(header.get("file_id")),
        chain=str(header.get("chain", "")),
        last_tag=tag,
        first_seq=first if isinstance(first, int) else 0,
        lines=len(entries),
        records=kinds.count("record"),
        recoveries=kinds.count("recovery"),
        sealed=kinds[-1] == "seal",
        origin=header["prev_tag"] == GENESIS and not header.get("prev_file_id") and first == 0,
        verdicts=Counter(str(e["verdict"]) for e in final),
        opened=frozenset(str(e.get("upstream_id")) for e in opened),
        settled=frozenset(str(e.get("upstream_id")) for e in final),
    )


def check_head(path: Path, key: bytes, summary: FileSummary) -> None:
    """The active file must reach at least its HMACed checkpoint: a shorter file lost its
    tail. Its tag is that of the line the checkpoint names."""
    after = summary.lines + 1
    try:
        head = orjson.loads(head_path(path).read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        name = head_path(path).name
        raise AuditVerifyError(
            path, after, f"no readable checkpoint {name}: tail unverifiable"
        ) from exc
    if not isinstance(head, dict) or not sealed(key, "head", head):
        raise AuditVerifyError(path, after, "checkpoint is forged or corrupt")
    if head.get("file_id") != summary.file_id:
        raise AuditVerifyError(path, after, "checkpoint belongs to another file")
    lines = head.get("lines")
    if not isinstance(lines, int) or lines > summary.lines:
        raise AuditVerifyError(path, after, f"truncated: checkpoint covers {lines} lines")
    tags = [e["tag"] for e in _entries(path)]
    if lines < 1 or not hmac.compare_digest(str(head.get("last_tag")), tags[lines - 1]):
        raise AuditVerifyError(path, lines, "checkpoint tag does not match this line")


def _check_key(paths: list[Path], key: bytes) -> None:
    """Wrong key, not tampering: every file says it was written under another key, and the
    checkpoint's MAC does not verify under it either (so an edited key check is tampering)."""
    try:
        head = orjson.loads(head_path(paths[-1]).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        head = None
    if isinstance(head, dict) and sealed(key, "head", head):
        return
    expected, checks = key_check(key), []
    for path in paths:
        try:
            header = orjson.loads(path.read_bytes().split(b"\n", 1)[0])
        except (OSError, orjson.JSONDecodeError):
            return
        if not isinstance(header, dict) or "key_check" not in header:
            return
        checks.append(hmac.compare_digest(str(header["key_check"]), expected))
    if checks and not any(checks):
        raise WrongKey(paths[-1], 1, "wrong key: this log was written under another audit key")


def _check_anchor(path: Path, anchor: Anchor, files: list[tuple[Path, FileSummary]]) -> None:
    active = files[-1][1]
    if anchor.chain != active.chain:
        raise AuditVerifyError(path, 1, "this log is another chain than its anchor's")
    for file, summary in files:
        if summary.file_id == anchor.file_id:
            index = anchor.seq - summary.first_seq
            tags = [e["tag"] for e in _entries(file)]
            if 0 <= index < len(tags) and hmac.compare_digest(tags[index], anchor.last_tag):
                return
    raise AuditVerifyError(
        path, active.lines + 1, f"rolled back or cut: its anchor records entry {anchor.seq}, "
        "which this log does not hold",
    )  # fmt: skip


def verify_files(paths: list[Path], key: bytes) -> list[FileSummary]:
    """Verify files oldest first; each must continue the chain of the one before."""
    summaries: list[FileSummary] = []
    for number, path in enumerate(paths, 1):
        summary = verify_file(path, key, summaries[-1] if summaries else None)
        if number < len(paths) and not summary.sealed:
            raise AuditVerifyError(path, summary.lines + 1, "rotated file not sealed: tail cut")
        summaries.append(summary)
    return summaries


def verify_chain(
    path: Path, key: bytes, anchor: Path | None = None, allow_pruned: bool = False
) -> list[FileSummary]:
    """Everything: all rotations and the active file `path`, the chain's origin, the checkpoint
    and, given its path, the anchor."""
    if not path.exists():
        raise AuditVerifyError(path, 0, "the active file is missing (deleted, or a crash while "
                               "rotating: start the gateway to recover)")  # fmt: skip
    paths = [*rotated_paths(path), path]
    _check_key(paths, key)
    summaries = verify_files(paths, key)
    if not summaries[0].origin and not allow_pruned:
        raise AuditVerifyError(
            paths[0], 1, "the chain does not start here: older files were deleted "
            "(--allow-pruned accepts that for files you removed on purpose)",
        )  # fmt: skip
    check_head(path, key, summaries[-1])
    if anchor is not None:
        try:
            found = read_anchor(anchor, key)
        except AnchorError as exc:
            raise AuditVerifyError(anchor, 0, str(exc)) from exc
        _check_anchor(path, found, list(zip(paths, summaries, strict=True)))
    return summaries
