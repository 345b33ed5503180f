"""`kvfence receipt verify RECEIPT --proof FILE (--log-key VKEY | --fingerprint FP |
--witness VKEY ...) [--request FILE] [--response FILE] [--keys KEYSET]`: check a receipt offline
(`kvfence.receipts.check`) from a trust root got out of band. The proof (a c2sp.org/tlog-proof,
from GET /v1/kvfence/receipts/{id}/proof) carries the checkpoint the record is proven in and the
record, which names the key set the receipt was signed under; each --witness must have cosigned
that checkpoint.

Exit 0 when every check passed; 1 when one failed (an edited receipt, request or response, a
record missing from the log, a substituted key set, a checkpoint not cosigned, no trust root
given); 2 when a file or key cannot be read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson

from kvfence.receipts.check import Root, verify
from kvfence.receipts.note import NoteError, Verifier
from kvfence.receipts.receipt import KeySet, ReceiptError

OK, FAILED, UNUSABLE = 0, 1, 2
MAX_FILE = 64 << 20


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    check = sub.add_parser("verify", help="verify a receipt offline")
    check.add_argument("receipt", type=Path, help="the receipt (GET /v1/kvfence/receipts/{id})")
    check.add_argument(
        "--keys", type=Path, help="the gateway's key set (GET /v1/kvfence/keys); the proof's "
        "record names it, so it is needed only without --proof",
    )  # fmt: skip
    check.add_argument("--request", type=Path, help="the request body exactly as you sent it")
    check.add_argument("--response", type=Path, help="the response body exactly as you got it")
    check.add_argument(
        "--proof", "--checkpoint", dest="proof", type=Path,
        help="the record's tlog-proof with its checkpoint (GET .../receipts/{id}/proof)",
    )  # fmt: skip
    check.add_argument(
        "--witness", action="append", default=[], metavar="VKEY",
        help="a witness's verifier key (NAME+ID+KEY) that must have cosigned the checkpoint",
    )  # fmt: skip
    check.add_argument(
        "--log-key", metavar="VKEY", help="trust root: the gateway's log key (NAME+ID+KEY)"
    )
    check.add_argument(
        "--fingerprint", metavar="FP",
        help="trust root: the key set's fingerprint the operator publishes (sha256:...)",
    )  # fmt: skip


def _read(path: Path | None) -> bytes | None:
    if path is None:
        return None
    with open(path, "rb") as fh:
        data = fh.read(MAX_FILE + 1)
    if len(data) > MAX_FILE:
        raise ValueError(f"{path} is larger than {MAX_FILE >> 20} MiB")
    return data


def main(args: argparse.Namespace) -> int:
    try:
        receipt = _read(args.receipt) or b""
        keys = _read(args.keys)
        keyset = KeySet.parse(orjson.loads(keys)) if keys is not None else None
        request, response = _read(args.request), _read(args.response)
        proof_bytes = _read(args.proof)
        proof = proof_bytes.decode() if proof_bytes is not None else None
        witnesses = [Verifier.parse(v) for v in args.witness]
        log_key = Verifier.parse(args.log_key) if args.log_key else None
    except (OSError, ValueError, ReceiptError, NoteError) as exc:
        detail = getattr(exc, "strerror", None) or str(exc)
        where = getattr(exc, "filename", None)
        print(f"kvfence receipt: {where + ': ' if where else ''}{detail}", file=sys.stderr)
        return UNUSABLE
    report = verify(
        receipt,
        keyset,
        request=request,
        response=response,
        proof=proof,
        root=Root(log_key, args.fingerprint, tuple(witnesses)),
    )
    for check in report.checks:
        print(f"{'ok    ' if check.ok else 'FAILED'} {check.name}: {check.message}")
    if report.ok:
        print(f"receipt {report.receipt_id}: verified; {report.summary}")
        return OK
    print(f"receipt {report.receipt_id}: NOT verified", file=sys.stderr)
    return FAILED
