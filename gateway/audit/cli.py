"""`kvfence audit verify [FILE] [--policy FILE] [--workers N]`: check an audit log, all of it
(gateway.audit.chain.verify): every rotation, the active file, its checkpoint and, with an
anchor, its anchor; for a gateway run with `--workers N`, every worker's chain
(`audit.wK.jsonl`) given the path the policy names. Prints the records per verdict. Exit 0
when every chain is intact; 1 when one was tampered with (or cut, rolled back, pruned,
missing); 2 when the key or the policy cannot be read; 3 when a log was written under another
key. Verdicts count each request's final record; a stream whose record was opened (before its
first byte) and never completed is counted and said, not failed: the gateway stopped while it
ran. `kvfence audit tenants` names the tenants behind the records' namespace labels
(gateway.audit.names)."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

from gateway.audit import names
from gateway.audit.chain.chains import Chain, ChainsError, find_chains, policy_audit
from gateway.audit.chain.format import mac_key
from gateway.audit.chain.verify import (
    AuditVerifyError,
    FileSummary,
    WrongKey,
    unfinished,
    verify_chain,
)
from kvfence.keys.secrets import from_env, from_file

OK, TAMPERED, UNUSABLE, WRONG_KEY = 0, 1, 2, 3


def load_key(key_env: str | None, key_file: Path | None) -> bytes:
    """The audit secret, read the way the policy reads `audit_log.key` (kvfence.keys.secrets)."""
    if key_file is not None:
        return mac_key(from_file(key_file))
    return mac_key(from_env(key_env or "KVFENCE_AUDIT_KEY"))


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    verify = sub.add_parser("verify", help="verify an audit log: every file, checkpoint, anchor")
    verify.add_argument(
        "file", type=Path, nargs="?", help="the audit log: the path in the policy's audit_log"
    )
    verify.add_argument(
        "--policy", type=Path, help="take the log's path, key and anchor from this policy"
    )
    verify.add_argument("--anchor", type=Path, help="the log's anchor (policy audit_log.anchor)")
    verify.add_argument(
        "--workers",
        type=int,
        help="the gateway's --workers: expect exactly that many chains (default: every one found)",
    )
    verify.add_argument(
        "--allow-pruned", action="store_true", help="accept a chain whose oldest files you deleted"
    )
    verify.add_argument(
        "--rotated", action="store_true", help="no effect: rotated files are always checked"
    )
    keys = verify.add_mutually_exclusive_group()
    keys.add_argument("--key-env", help="env var holding the key (default KVFENCE_AUDIT_KEY)")
    keys.add_argument("--key-file", type=Path, help="file holding the key")
    names.configure(sub.add_parser("tenants", help="name the tenants behind namespace labels"))


def _settings(args: argparse.Namespace) -> tuple[Path, Path | None, bytes]:
    """The log's path, anchor and MAC key from the options (which override the policy)."""
    path, anchor, secret = args.file, args.anchor, None
    if args.policy is not None:
        found = policy_audit(args.policy)
        path, anchor = path or found.path, anchor or found.anchor
        secret = found.key
    if path is None:
        raise ChainsError("name the audit log (the policy's audit_log.path) or pass --policy")
    if args.workers is not None and args.workers < 1:
        raise ChainsError("--workers must be at least 1")
    if args.key_file is not None or args.key_env is not None or secret is None:
        return path, anchor, load_key(args.key_env, args.key_file)
    return path, anchor, mac_key(secret)


def _verdicts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{v} {n}" for v, n in sorted(counts.items())) or "no records"


def _one(chain: Chain, key: bytes, allow_pruned: bool) -> tuple[int, list[FileSummary]]:
    try:
        return OK, verify_chain(chain.path, key, chain.anchor, allow_pruned)
    except WrongKey as exc:
        print(f"kvfence audit: WRONG KEY {exc}", file=sys.stderr)
        return WRONG_KEY, []
    except AuditVerifyError as exc:
        print(f"kvfence audit: FAILED {exc}", file=sys.stderr)
        return TAMPERED, []


def _describe(summaries: list[FileSummary], anchored: bool) -> str:
    records = sum(s.records for s in summaries)
    recovered = sum(s.recoveries for s in summaries)
    start = "from its origin" if summaries[0].origin else "pruned: its oldest files are gone"
    checked = (
        "checkpoint and anchor intact"
        if anchored
        else "checkpoint intact (no --anchor: a rollback of file and checkpoint together "
        "would not be seen)"
    )
    n = len(summaries)
    out = f"ok: {records} records in {n} file(s), chain {start}, {recovered} recoveries, {checked}"
    cut = unfinished(summaries)
    if cut:
        out += (f"; {cut} stream(s) opened and never completed (the gateway stopped while "
                "they ran, or they run now)")  # fmt: skip
    return out


def main(args: argparse.Namespace) -> int:
    if args.action == "tenants":
        return names.main(args)
    try:
        path, anchor, key = _settings(args)
        chains = find_chains(path, anchor, args.workers)
    except (ChainsError, OSError, ValueError) as exc:
        print(f"kvfence audit: {exc}", file=sys.stderr)
        return UNUSABLE
    codes, total, intact = [], Counter[str](), 0
    for chain in chains:
        code, summaries = _one(chain, key, args.allow_pruned)
        codes.append(code)
        if code != OK:
            continue
        intact += 1
        counts = Counter[str]()
        for summary in summaries:
            counts.update(summary.verdicts)
        total.update(counts)
        prefix = f"{chain.path.name}: " if len(chains) > 1 else ""
        print(f"{prefix}{_describe(summaries, chain.anchor is not None)}")
        print(f"{' ' * len(prefix)}verdicts: {_verdicts(counts)}")
    if len(chains) > 1:
        state = "ok" if intact == len(chains) else "FAILED"
        print(f"{state}: {intact} of {len(chains)} chains intact; verdicts: {_verdicts(total)}")
    if TAMPERED in codes:
        return TAMPERED
    return WRONG_KEY if WRONG_KEY in codes else OK
