"""Verifying an audit log: its HMAC chain, its rotation links and its checkpoint.

Invariant: `verify_files` returns only when every line of every file checks under the key;
otherwise it raises `AuditVerifyError` naming the first bad file and line.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from gateway.audit.log import chain_tag, head_mac, head_path


class AuditVerifyError(Exception):
    def __init__(self, path: Path, line: int, reason: str) -> None:
        super().__init__(f"{path}:{line}: {reason}")
        self.path, self.line, self.reason = path, line, reason


@dataclass(frozen=True, slots=True)
class FileSummary:
    file_id: str
    last_tag: str
    lines: int
    records: int
    sealed: bool


def _entries(path: Path) -> list[dict[str, Any]]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise AuditVerifyError(path, 0, f"cannot read ({exc.strerror})") from exc
    *lines, rest = data.split(b"\n")
    if rest:
        raise AuditVerifyError(path, len(lines) + 1, "torn last line (no newline)")
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
    if header.get("kind") != "header" or header.get("v") != 1:
        raise AuditVerifyError(path, 1, "first line is not a version 1 header")
    start = header.get("prev_tag")
    if not isinstance(start, str) or len(start) != 64:
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
    try:
        tag = _check_start(path, entries[0], prev)
        bytes.fromhex(tag)
    except ValueError as exc:
        raise AuditVerifyError(path, 1, "header prev_tag is not hex") from exc
    for number, entry in enumerate(entries, 1):
        expected = chain_tag(key, tag, entry)
        if not hmac.compare_digest(expected, entry["tag"]):
            raise AuditVerifyError(
                path, number, "tag mismatch: record edited, inserted, deleted or reordered"
            )
        kind = entry.get("kind")
        if (kind == "header") != (number == 1) or kind not in ("header", "record", "seal"):
            raise AuditVerifyError(path, number, f"unexpected {kind!r} line")
        if kind == "seal" and (number != len(entries) or entry.get("lines") != number):
            raise AuditVerifyError(path, number + 1, "lines after the seal")
        tag = entry["tag"]
    sealed = entries[-1].get("kind") == "seal"
    summary = FileSummary(
        str(entries[0].get("file_id")),
        tag,
        len(entries),
        sum(1 for e in entries if e.get("kind") == "record"),
        sealed,
    )
    if not sealed:
        _check_head(path, key, summary, entries)
    return summary


def _check_head(
    path: Path, key: bytes, summary: FileSummary, entries: list[dict[str, Any]]
) -> None:
    """An unsealed (active) file must reach at least its HMACed checkpoint: a shorter file
    has lost its tail."""
    after = summary.lines + 1
    try:
        head = orjson.loads(head_path(path).read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise AuditVerifyError(
            path, after, f"no readable checkpoint {head_path(path).name}: tail unverifiable"
        ) from exc
    if not isinstance(head, dict) or not hmac.compare_digest(
        str(head.get("mac")), head_mac(key, head)
    ):
        raise AuditVerifyError(path, after, "checkpoint is forged or corrupt")
    if head.get("file_id") != summary.file_id:
        raise AuditVerifyError(path, after, "checkpoint belongs to another file")
    lines = head.get("lines")
    if not isinstance(lines, int) or lines > summary.lines:
        raise AuditVerifyError(path, after, f"truncated: checkpoint covers {lines} lines")
    if lines < 1 or not hmac.compare_digest(str(head.get("last_tag")), entries[lines - 1]["tag"]):
        raise AuditVerifyError(path, lines, "checkpoint tag does not match this line")


def verify_files(paths: list[Path], key: bytes) -> list[FileSummary]:
    """Verify files oldest first; each must continue the chain of the one before."""
    summaries: list[FileSummary] = []
    for path in paths:
        summaries.append(verify_file(path, key, summaries[-1] if summaries else None))
    return summaries
