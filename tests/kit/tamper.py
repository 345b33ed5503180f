"""The tamper kinds an operator with write access to the log's folder could try, as functions
over a built log; shared by tests/gateway/audit/chain/test_audit_tamper.py and bench/hardening.py
(which also runs them against an older checkout's writer and verifier).

A built log: 49 records over two rotated files and the active file, written in two
sessions (a snapshot of the folder is kept after the first, for rollbacks), an anchor in another
folder, and a second chain under the same key (for splices)."""

from __future__ import annotations

import inspect
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from gateway.audit.chain.log import AuditLog

SECRET = b"correct horse battery staple 01"


@dataclass(frozen=True)
class Log:
    folder: Path
    active: Path
    anchor: Path | None
    snapshot: Path  # the folder after the first session
    other: Path  # the folder of another chain under the same key

    @property
    def rotations(self) -> list[Path]:
        found = [p for p in self.folder.iterdir() if p.suffix[1:].isdigit()]
        return sorted(found, key=lambda p: int(p.suffix[1:]))

    @property
    def head(self) -> Path:
        return self.active.with_name(self.active.name + ".head")


def record(i: int) -> dict[str, Any]:
    return {"request_id": f"req-{i}", "tenant": "acme", "verdict": "clean", "status": 200,
            "cached_tokens": 16, "namespace": "3f2a9c01d4e5"}  # fmt: skip


async def write(path: Path, first: int, count: int, anchor: Path | None) -> None:
    kw: dict[str, Any] = {"rotate_bytes": 4096, "fsync": "batch", "batch_max_records": 4}
    if anchor is not None:
        kw["anchor"] = anchor
    log = AuditLog(path, SECRET, **kw)
    for i in range(first, first + count):
        await log.append(record(i))
    await log.close()


async def build(tmp: Path, anchor: bool = True) -> Log:
    folder, anchors = tmp / "logs", tmp / "anchor"
    folder.mkdir()
    anchors.mkdir()
    log = Log(folder, folder / "audit.jsonl", anchors / "audit.anchor" if anchor else None,
              tmp / "snapshot", tmp / "other")  # fmt: skip
    await write(log.active, 0, 45, log.anchor)  # two rotated files and an active one
    shutil.copytree(folder, log.snapshot)
    await write(log.active, 45, 4, log.anchor)  # the same files: no rotation in between
    assert [p.name for p in log.rotations] == ["audit.jsonl.1", "audit.jsonl.2"]
    log.other.mkdir()
    await write(log.other / "audit.jsonl", 0, 5, None)
    return log


def lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def put(path: Path, parts: list[bytes]) -> None:
    path.write_bytes(b"".join(parts))


def edit(path: Path, index: int, old: bytes, new: bytes) -> None:
    parts = lines(path)
    assert old in parts[index], (path, index)
    parts[index] = parts[index].replace(old, new)
    put(path, parts)


def rollback(log: Log, *names: str) -> None:
    for name in names:
        shutil.copy2(log.snapshot / name, log.folder / name)


def _forged_record(log: Log) -> None:
    parts = lines(log.active)
    last = orjson.loads(parts[-1])
    last.update(seq=last["seq"] + 1, request_id="forged", tag="ab" * 32)
    put(log.active, [*parts, orjson.dumps(last) + b"\n"])


def _rotation_as_active(log: Log, keep_head: bool) -> None:
    """Drop the active file; the newest rotation becomes the active file again, with the
    snapshot's checkpoint (which names the dropped file) or none."""
    newest = log.rotations[-1]
    os.replace(newest, log.active)
    if keep_head:
        rollback(log, "audit.jsonl.head")
    else:
        log.head.unlink()


def _swap_rotations(log: Log) -> None:
    a, b = log.rotations[0], log.rotations[1]
    tmp = a.with_name("swap.tmp")
    os.replace(a, tmp)
    os.replace(b, a)
    os.replace(tmp, b)


def _splice(path: Path, at: int, line: bytes | None = None, drop: int = 0) -> None:
    """Insert `line` (None: nothing) at index `at`, after dropping `drop` lines there."""
    parts = lines(path)
    put(path, [*parts[:at], *([line] if line is not None else []), *parts[at + drop :]])


def _reorder(log: Log) -> None:
    parts = lines(log.active)
    put(log.active, [*parts[:2], parts[3], parts[2], *parts[4:]])


def _remove_tag(log: Log) -> None:
    parts = lines(log.active)
    put(log.active, [*parts[:-1], parts[-1].split(b',"tag"')[0] + b"}\n"])


def _other_chain(log: Log, *names: str) -> None:
    for name in names:
        shutil.copy2(log.other / name, log.folder / name)


def _cut_to_snapshot(log: Log) -> None:
    put(log.active, lines(log.active)[: len(lines(log.snapshot / "audit.jsonl"))])
    rollback(log, "audit.jsonl.head")


def _whole_folder(log: Log) -> None:
    shutil.rmtree(log.folder)
    shutil.copytree(log.snapshot, log.folder)


def _delete(*paths: Path) -> None:
    for path in paths:
        path.unlink()


def _forge_anchor(log: Log) -> None:
    assert log.anchor is not None
    log.anchor.write_bytes(log.anchor.read_bytes().replace(b'"seq":', b'"seq":1'))


Tamper = Callable[[Log], None]
CLEAN, CACHED = (b'"clean"', b'"violation"'), (b'"cached_tokens":16', b'"cached_tokens":0')
# name -> (tamper, detectable without the anchor)
ACTIVE: dict[str, tuple[Tamper, bool]] = {
    "edit_record_field": (lambda g: edit(g.active, 2, *CLEAN), True),
    "edit_record_number": (lambda g: edit(g.active, 2, *CACHED), True),
    "delete_record": (lambda g: _splice(g.active, 2, drop=1), True),
    "duplicate_record": (lambda g: _splice(g.active, 3, lines(g.active)[2]), True),
    "reorder_records": (_reorder, True),
    "cut_last_line": (lambda g: put(g.active, lines(g.active)[:-1]), True),
    "torn_tail": (lambda g: g.active.write_bytes(g.active.read_bytes()[:-5]), True),
    "cut_to_header": (lambda g: put(g.active, lines(g.active)[:1]), True),
    "delete_header_line": (lambda g: _splice(g.active, 0, drop=1), True),
    "edit_header_prev_tag": (lambda g: edit(g.active, 0, b'"prev_tag":"', b'"prev_tag":"0'), True),
    "edit_header_key_check": (
        lambda g: edit(g.active, 0, b'"key_check":"', b'"key_check":"0'),
        True,
    ),
    "append_forged_record": (_forged_record, True),
    "append_garbage_line": (lambda g: _splice(g.active, 10**6, b'{"kind":"record"}\n'), True),
    "empty_active_file": (lambda g: g.active.write_bytes(b""), True),
    "delete_active_file": (lambda g: _delete(g.active), True),
    "delete_head": (lambda g: _delete(g.head), True),
    "forge_head": (lambda g: edit(g.head, 0, b'"lines":', b'"lines":1'), True),
    "head_of_another_chain": (lambda g: _other_chain(g, "audit.jsonl.head"), True),
    "active_of_another_chain": (lambda g: _other_chain(g, "audit.jsonl", "audit.jsonl.head"), True),
    "edit_record_seq": (lambda g: edit(g.active, 2, b'"seq":', b'"seq":1'), True),
    "remove_tag": (_remove_tag, True),
    "record_moved_from_rotation": (lambda g: _splice(g.active, 3, lines(g.rotations[0])[3]), True),
    "newest_rotation_as_active_old_head": (lambda g: _rotation_as_active(g, True), True),
    "newest_rotation_as_active_no_head": (lambda g: _rotation_as_active(g, False), True),
    # rollbacks: only the anchor, kept elsewhere, shows them
    "old_head_restored_file_cut": (_cut_to_snapshot, False),
    "file_and_head_rolled_back": (lambda g: rollback(g, "audit.jsonl", "audit.jsonl.head"), False),
    "whole_folder_rolled_back": (_whole_folder, False),
}
ROTATED: dict[str, tuple[Tamper, bool]] = {
    "edit_record_in_oldest_rotation": (lambda g: edit(g.rotations[0], 2, *CLEAN), True),
    "edit_record_in_newest_rotation": (lambda g: edit(g.rotations[-1], 2, *CLEAN), True),
    "delete_oldest_rotation": (lambda g: _delete(g.rotations[0]), True),
    "delete_two_oldest_rotations": (lambda g: _delete(*g.rotations[:2]), True),
    "delete_all_rotations": (lambda g: _delete(*g.rotations), True),
    "delete_middle_rotation": (lambda g: _delete(g.rotations[1]), True),
    "swap_two_rotations": (_swap_rotations, True),
    "cut_seal_of_rotation": (lambda g: put(g.rotations[0], lines(g.rotations[0])[:-1]), True),
    "line_after_seal": (lambda g: _splice(g.rotations[0], 10**6, lines(g.rotations[0])[1]), True),
    "rotation_replaced_by_another": (lambda g: shutil.copy2(g.rotations[0], g.rotations[1]), True),
    "edit_seal_lines": (lambda g: edit(g.rotations[0], -1, b'"lines":', b'"lines":1'), True),
    "insert_record_into_rotation": (
        lambda g: _splice(g.rotations[1], 1, lines(g.rotations[0])[1]),
        True,
    ),
    "newest_rotation_and_active_deleted": (
        lambda g: _delete(g.rotations[-1], g.active, g.head),
        True,
    ),
}
ANCHOR: dict[str, tuple[Tamper, bool]] = {
    "anchor_deleted": (lambda g: _delete(g.anchor) if g.anchor else None, False),
    "anchor_forged": (_forge_anchor, False),
}
KINDS: dict[str, tuple[Tamper, bool]] = {**ACTIVE, **ROTATED, **ANCHOR}


def source(name: str) -> str:
    """One tamper kind's code, for reports."""
    return inspect.getsource(KINDS[name][0]).strip()
