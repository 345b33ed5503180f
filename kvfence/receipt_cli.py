"""`kvfence receipt verify RECEIPT --keys KEYSET [--request FILE] [--response FILE]
[--proof FILE] [--witness VKEY ...] [--log-key VKEY]`: check a receipt offline
(`kvfence.receipt_check`). The proof (a c2sp.org/tlog-proof, from GET
/v1/kvfence/receipts/{id}/proof) carries the checkpoint the record is proven in; each --witness
must have cosigned that checkpoint.

Exit 0 when every check given passed; 1 when one failed (an edited receipt, request or
response, a record missing from the log, a checkpoint not cosigned); 2 when a file or key
cannot be read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson

from kvfence.note import NoteError, Verifier
from kvfence.receipt import KeySet, ReceiptError
from kvfence.receipt_check import verify

OK, FAILED, UNUSABLE = 0, 1, 2
MAX_FILE = 64 << 20


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    check = sub.add_parser("verify", help="verify a receipt offline")
    check.add_argument("receipt", type=Path, help="the receipt (GET /v1/kvfence/receipts/{id})")
    check.add_argument(
        "--keys", type=Path, required=True, help="the gateway's key set (GET /v1/kvfence/keys)"
    )
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
        "--log-key", metavar="VKEY", help="pin the log's key instead of taking the key set's"
    )


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
        keyset = KeySet.parse(orjson.loads(_read(args.keys) or b"null"))
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
        witnesses=witnesses,
        log_key=log_key,
    )
    for check in report.checks:
        print(f"{'ok    ' if check.ok else 'FAILED'} {check.name}: {check.message}")
    if report.ok:
        print(f"receipt {report.receipt_id}: verified; {report.summary}")
        if proof is None:
            print("  (no --proof: its record in the witnessed log was not checked)")
        return OK
    print(f"receipt {report.receipt_id}: NOT verified", file=sys.stderr)
    return FAILED
