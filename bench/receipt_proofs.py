"""What a receipt log's checkpoint and proofs cost as the log grows: a tenant's log of N leaves in
the embedded control database (SQLite), its first checkpoint, then inclusion proofs of random
entries, with the longest stall of the event loop meanwhile (a 1 ms ticker beside them). With
`--compare REV` the same in the same run with the ledger code of REV, each in a process of its own.

    .venv/bin/python -m bench.receipt_proofs [--sizes 10000 100000] [--compare REV]

Prints the figures and writes bench/results/receipt_proofs.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LOG = "gateway.example/receipts/acme"
PROOFS = 20


async def measure(size: int) -> dict[str, float]:
    """In this process, with the `gateway` and `kvfence` first on sys.path."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from gateway.control.receipts import ReceiptLedger
    from gateway.control.sqlite import SqliteEngine
    from gateway.control.store import ControlStore
    from kvfence.receipts.merkle import leaf_hash
    from kvfence.receipts.note import ED25519, Signer

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "control.db"
        store = ControlStore(SqliteEngine(path))
        await store.migrate()
        with sqlite3.connect(path) as db:
            rows = ((LOG, i, leaf_hash(b"entry %d" % i).hex()) for i in range(size))
            db.executemany("INSERT INTO receipt_leaves (log, idx, hash) VALUES (?, ?, ?)", rows)
        ledger = ReceiptLedger(store)
        signer = Signer("gateway.example/receipts", ED25519, Ed25519PrivateKey.generate())
        stalls: list[float] = []

        async def ticker() -> None:
            while True:
                start = time.perf_counter()
                await asyncio.sleep(0.001)
                stalls.append(time.perf_counter() - start)

        tick = asyncio.create_task(ticker())
        start = time.perf_counter()
        note, _ = await ledger.checkpoint(LOG, signer)
        first = time.perf_counter() - start
        proofs = []
        for index in random.Random(7).sample(range(size), PROOFS):
            start = time.perf_counter()
            await ledger.inclusion(LOG, index, note, size, b"entry")
            proofs.append(time.perf_counter() - start)
        tick.cancel()
        await store.close()
    proofs.sort()
    return {
        "leaves": size,
        "first_checkpoint_ms": first * 1e3,
        "proof_p50_ms": proofs[PROOFS // 2] * 1e3,
        "proof_max_ms": proofs[-1] * 1e3,
        "longest_loop_stall_ms": max(stalls) * 1e3,
    }


def _in_tree(tree: Path, size: int) -> dict[str, float]:
    code = (
        f"import sys, asyncio, json; sys.path.insert(0, {str(tree)!r}); "
        f"sys.path.insert(1, {str(ROOT)!r}); from bench.receipt_proofs import measure; "
        f"print(json.dumps(asyncio.run(measure({size}))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True, text=True)
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--compare", help="also the ledger code of this git revision")
    parser.add_argument("--output", type=Path, default=ROOT / "bench/results/receipt_proofs.json")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from bench.gateway.procs import exported
    from bench.machine import describe

    trees: dict[str, Path] = {"this tree": ROOT}
    results: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        if args.compare:
            trees[str(args.compare)] = stack.enter_context(exported(ROOT, args.compare))
        print(
            f"{'code':<12}{'leaves':>9}{'first ms':>10}{'proof p50':>11}{'max':>8}{'stall ms':>10}"
        )
        for size in args.sizes:
            for name, tree in trees.items():
                row = {"code": name, **_in_tree(tree, size)}
                results.append(row)
                print(
                    f"{name:<12}{size:>9}{row['first_checkpoint_ms']:>10.0f}"
                    f"{row['proof_p50_ms']:>11.1f}{row['proof_max_ms']:>8.1f}"
                    f"{row['longest_loop_stall_ms']:>10.0f}"
                )
    doc = {"host": describe(torch_info=False), "proofs_per_size": PROOFS, "runs": results}
    args.output.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
