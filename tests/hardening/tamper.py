"""The tamper kinds an operator with write access to the log's folder could try, as functions
over a built log; shared by tests/hardening/test_audit_tamper.py and bench/hardening_tamper.py
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

from gateway.audit.log import AuditLog

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


def _swap(a: Path, b: Path) -> None:
    tmp = a.with_name("swap.tmp")
    os.replace(a, tmp)
    os.replace(b, a)
    os.replace(tmp, b)


Tamper = Callable[[Log], None]
# name -> (tamper, detectable without the anchor)
ACTIVE: dict[str, tuple[Tamper, bool]] = {
    "edit_record_field": (lambda g: edit(g.active, 2, b'"clean"', b'"violation"'), True),
    "edit_record_number": (lambda g: edit(g.active, 2, b'"cached_tokens":16', b'"cached_tokens":0'), True),
    "delete_record": (lambda g: put(g.active, lines(g.active)[:2] + lines(g.active)[3:]), True),
    "duplicate_record": (lambda g: put(g.active, [*lines(g.active)[:3], lines(g.active)[2], *lines(g.active)[3:]]), True),
    "reorder_records": (lambda g: put(g.active, [*lines(g.active)[:2], lines(g.active)[3], lines(g.active)[2], *lines(g.active)[4:]]), True),
    "cut_last_line": (lambda g: put(g.active, lines(g.active)[:-1]), True),
    "torn_tail": (lambda g: g.active.write_bytes(g.active.read_bytes()[:-5]), True),
    "cut_to_header": (lambda g: put(g.active, lines(g.active)[:1]), True),
    "delete_header_line": (lambda g: put(g.active, lines(g.active)[1:]), True),
    "edit_header_prev_tag": (lambda g: edit(g.active, 0, b'"prev_tag":"', b'"prev_tag":"0'), True),
    "edit_header_key_check": (lambda g: edit(g.active, 0, b'"key_check":"', b'"key_check":"0'), True),
    "append_forged_record": (_forged_record, True),
    "append_garbage_line": (lambda g: put(g.active, [*lines(g.active), b'{"kind":"record"}\n']), True),
    "empty_active_file": (lambda g: g.active.write_bytes(b""), True),
    "delete_active_file": (lambda g: g.active.unlink(), True),
    "delete_head": (lambda g: g.head.unlink(), True),
    "forge_head": (lambda g: g.head.write_bytes(g.head.read_bytes().replace(b'"lines":', b'"lines":1')), True),
    "head_of_another_chain": (lambda g: shutil.copy2(g.other / "audit.jsonl.head", g.head), True),
    "active_of_another_chain": (lambda g: [shutil.copy2(g.other / n, g.folder / n) for n in ("audit.jsonl", "audit.jsonl.head")] and None, True),
    "edit_record_seq": (lambda g: edit(g.active, 2, b'"seq":', b'"seq":1'), True),
    "remove_tag": (lambda g: put(g.active, [*lines(g.active)[:-1], lines(g.active)[-1].split(b',"tag"')[0] + b"}\n"]), True),
    "record_moved_from_rotation": (lambda g: put(g.active, [*lines(g.active), lines(g.rotations[0])[1]]), True),
    # rollbacks: only the anchor, kept elsewhere, shows them
    "old_head_restored_file_cut": (lambda g: (put(g.active, lines(g.active)[: len(lines(g.snapshot / "audit.jsonl"))]), rollback(g, "audit.jsonl.head")) and None, False),
    "file_and_head_rolled_back": (lambda g: rollback(g, "audit.jsonl", "audit.jsonl.head"), False),
    "whole_folder_rolled_back": (lambda g: (shutil.rmtree(g.folder), shutil.copytree(g.snapshot, g.folder)) and None, False),
    "newest_rotation_as_active_old_head": (lambda g: _rotation_as_active(g, True), True),
    "newest_rotation_as_active_no_head": (lambda g: _rotation_as_active(g, False), True),
}  # fmt: skip
ROTATED: dict[str, tuple[Tamper, bool]] = {
    "edit_record_in_oldest_rotation": (lambda g: edit(g.rotations[0], 2, b'"clean"', b'"violation"'), True),
    "edit_record_in_newest_rotation": (lambda g: edit(g.rotations[-1], 2, b'"clean"', b'"violation"'), True),
    "delete_oldest_rotation": (lambda g: g.rotations[0].unlink(), True),
    "delete_two_oldest_rotations": (lambda g: [p.unlink() for p in g.rotations[:2]] and None, True),
    "delete_all_rotations": (lambda g: [p.unlink() for p in g.rotations] and None, True),
    "delete_middle_rotation": (lambda g: g.rotations[1].unlink(), True),
    "swap_two_rotations": (lambda g: _swap(g.rotations[0], g.rotations[1]), True),
    "cut_seal_of_rotation": (lambda g: put(g.rotations[0], lines(g.rotations[0])[:-1]), True),
    "line_after_seal": (lambda g: put(g.rotations[0], [*lines(g.rotations[0]), lines(g.rotations[0])[1]]), True),
    "rotation_replaced_by_another": (lambda g: shutil.copy2(g.rotations[0], g.rotations[1]), True),
    "edit_seal_lines": (lambda g: edit(g.rotations[0], -1, b'"lines":', b'"lines":1'), True),
    "insert_record_into_rotation": (lambda g: put(g.rotations[1], [lines(g.rotations[1])[0], lines(g.rotations[0])[1], *lines(g.rotations[1])[1:]]), True),
    "newest_rotation_and_active_deleted": (lambda g: (g.rotations[-1].unlink(), g.active.unlink(), g.head.unlink()) and None, True),
}  # fmt: skip
ANCHOR: dict[str, tuple[Tamper, bool]] = {
    "anchor_deleted": (lambda g: g.anchor.unlink() if g.anchor else None, False),
    "anchor_forged": (lambda g: g.anchor.write_bytes(g.anchor.read_bytes().replace(b'"seq":', b'"seq":1')) if g.anchor else None, False),
}  # fmt: skip
KINDS: dict[str, tuple[Tamper, bool]] = {**ACTIVE, **ROTATED, **ANCHOR}


def source(name: str) -> str:
    """One tamper kind's code, for reports."""
    return inspect.getsource(KINDS[name][0]).strip()
