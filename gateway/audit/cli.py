"""`kvfence audit verify`: check an audit log (gateway.audit.verify). Exit 0 with a summary
when intact, 1 with the first bad file and line when not, 2 when the key cannot be read."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gateway.audit.log import mac_key, rotated_paths
from gateway.audit.verify import AuditVerifyError, verify_files
from kvfence.secrets import from_env, from_file


def load_key(key_env: str | None, key_file: Path | None) -> bytes:
    """The audit secret, read the way the policy reads `audit_log.key` (kvfence.secrets)."""
    if key_file is not None:
        return mac_key(from_file(key_file))
    return mac_key(from_env(key_env or ""))


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    verify = sub.add_parser("verify", help="verify an audit log")
    verify.add_argument("file", type=Path, help="the audit log (the active file)")
    verify.add_argument("--rotated", action="store_true", help="also verify FILE.1, FILE.2, ...")
    keys = verify.add_mutually_exclusive_group()
    keys.add_argument("--key-env", default="KVFENCE_AUDIT_KEY", help="env var holding the key")
    keys.add_argument("--key-file", type=Path, help="file holding the key")


def main(args: argparse.Namespace) -> int:
    try:
        key = load_key(args.key_env, args.key_file)
    except (OSError, ValueError) as exc:
        print(f"kvfence audit: {exc}", file=sys.stderr)
        return 2
    paths = [*rotated_paths(args.file), args.file] if args.rotated else [args.file]
    try:
        summaries = verify_files(paths, key)
    except AuditVerifyError as exc:
        print(f"kvfence audit: FAILED {exc}", file=sys.stderr)
        return 1
    records = sum(s.records for s in summaries)
    print(f"ok: {records} records in {len(summaries)} file(s), chain and checkpoint intact")
    return 0
