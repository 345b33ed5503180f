"""Which chains one configured audit log path stands for: the path itself (one gateway process)
and each worker's `audit.wK.jsonl` (`--workers N`), each with its anchor; and the audit log
settings read from a policy, without the rest of the policy's secrets.

Invariant: a worker chain whose anchor survives is found even when its log files were deleted,
and with an expected worker count a missing chain is reported, never skipped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gateway.audit.chain.format import worker_path
from kvfence.keys.secrets import from_env, from_file


class ChainsError(Exception):
    """The chains cannot be named: one line with the cause and the fix."""


@dataclass(frozen=True, slots=True)
class Chain:
    path: Path  # the active file
    anchor: Path | None
    worker: int | None


@dataclass(frozen=True, slots=True)
class PolicyAudit:
    path: Path
    anchor: Path | None
    key: bytes


def _workers_in(folder: Path, stem: str, suffix: str) -> set[int]:
    pattern = re.compile(rf"^{re.escape(stem)}\.w([0-9]+){re.escape(suffix)}$")
    if not folder.is_dir():
        return set()
    return {int(m.group(1)) for p in folder.iterdir() if (m := pattern.match(p.name))}


def find_chains(path: Path, anchor: Path | None, workers: int | None) -> list[Chain]:
    """The chains for the policy's `path`: `workers` (N > 1) expects exactly w1..wN; None finds
    the single chain and every worker chain (by its log or by its anchor)."""

    def chain(worker: int | None) -> Chain:
        found = None if anchor is None else worker_path(anchor, worker)
        return Chain(worker_path(path, worker), found, worker)

    if workers is not None:
        if workers == 1:
            return [chain(None)]
        return [chain(w) for w in range(1, workers + 1)]
    numbers = _workers_in(path.parent, path.stem, path.suffix)
    if anchor is not None:
        numbers |= _workers_in(anchor.parent, anchor.stem, anchor.suffix)
    single = path.exists() or (anchor is not None and anchor.exists()) or not numbers
    return ([chain(None)] if single else []) + [chain(w) for w in sorted(numbers)]


def _secret(ref: Any, base: Path, where: str) -> bytes:
    if isinstance(ref, dict) and set(ref) == {"env"}:
        return from_env(str(ref["env"]))
    if isinstance(ref, dict) and set(ref) == {"file"}:
        return from_file(base / str(ref["file"]))
    raise ChainsError(f"{where} must be {{env: NAME}} or {{file: PATH}}")


def policy_audit(policy: Path) -> PolicyAudit:
    """`gateway.audit_log` of `policy` (paths relative to its folder, as the gateway reads
    them), read without resolving the policy's other secrets."""
    try:
        doc = yaml.safe_load(policy.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ChainsError(f"cannot read policy {policy}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ChainsError(f"{policy} is not valid YAML: run `kvfence policy check`") from exc
    gateway = doc.get("gateway") if isinstance(doc, dict) else None
    settings = gateway.get("audit_log") if isinstance(gateway, dict) else None
    if not isinstance(settings, dict) or not isinstance(settings.get("path"), str):
        raise ChainsError(f"{policy} has no gateway.audit_log.path: this gateway keeps no log")
    base = policy.parent
    anchor = settings.get("anchor")
    return PolicyAudit(
        path=base / settings["path"],
        anchor=base / anchor if isinstance(anchor, str) else None,
        key=_secret(settings.get("key"), base, f"{policy}: gateway.audit_log.key"),
    )
