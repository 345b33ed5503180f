"""`kvfence audit verify FILE`: check an audit log, all of it (gateway.audit.verify): every
rotation, the active file, its checkpoint and, with `--anchor`, its anchor. Exit 0 with a
summary when intact; 1 with the first bad file and line when tampered with (or cut, rolled back,
pruned); 2 when the key cannot be read; 3 when the log was written under another key."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gateway.audit.chain import mac_key
from gateway.audit.verify import AuditVerifyError, WrongKey, verify_chain
from kvfence.secrets import from_env, from_file


def load_key(key_env: str | None, key_file: Path | None) -> bytes:
    """The audit secret, read the way the policy reads `audit_log.key` (kvfence.secrets)."""
    if key_file is not None:
        return mac_key(from_file(key_file))
    return mac_key(from_env(key_env or ""))


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    verify = sub.add_parser("verify", help="verify an audit log: every file, checkpoint, anchor")
    verify.add_argument("file", type=Path, help="the audit log (the active file)")
    verify.add_argument("--anchor", type=Path, help="the log's anchor (policy audit_log.anchor)")
    verify.add_argument(
        "--allow-pruned", action="store_true", help="accept a chain whose oldest files you deleted"
    )
    verify.add_argument("--rotated", action="store_true", help=argparse.SUPPRESS)  # always now
    keys = verify.add_mutually_exclusive_group()
    keys.add_argument("--key-env", default="KVFENCE_AUDIT_KEY", help="env var holding the key")
    keys.add_argument("--key-file", type=Path, help="file holding the key")


def main(args: argparse.Namespace) -> int:
    try:
        key = load_key(args.key_env, args.key_file)
    except (OSError, ValueError) as exc:
        print(f"kvfence audit: {exc}", file=sys.stderr)
        return 2
    try:
        summaries = verify_chain(args.file, key, args.anchor, args.allow_pruned)
    except WrongKey as exc:
        print(f"kvfence audit: WRONG KEY {exc}", file=sys.stderr)
        return 3
    except AuditVerifyError as exc:
        print(f"kvfence audit: FAILED {exc}", file=sys.stderr)
        return 1
    records = sum(s.records for s in summaries)
    recovered = sum(s.recoveries for s in summaries)
    start = "from its origin" if summaries[0].origin else "pruned: its oldest files are gone"
    checked = (
        "checkpoint and anchor intact"
        if args.anchor
        else "checkpoint intact (no --anchor: a rollback of file and checkpoint together "
        "would not be seen)"
    )
    n = len(summaries)
    print(f"ok: {records} records in {n} file(s), chain {start}, {recovered} recoveries, {checked}")
    return 0
