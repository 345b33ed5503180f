"""What receipts cost per request: the same open-loop traffic sent, in one run, directly to a
fake upstream and through three one-worker gateways side by side: without an audit log, with
the audit log (fsync batch), and with the audit log as a witnessed log plus a signed receipt
per answer; then the sizes of a receipt, its proof and the key set. Run:
.venv/bin/python -m bench.gateway.receipts [--nice -10]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import secrets
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import uvloop

if __package__ in (None, ""):  # `python bench/gateway/receipts.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gateway import procs
from bench.gateway.overhead import Bench
from bench.gateway.report import HEADER, Point, added, machine, row
from bench.gateway.traffic import scenarios
from kvfence.keys.keyfile import generate_key, write_private_key

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUTPUT = REPO_ROOT / "bench" / "results" / "gateway_receipts.json"
CONFIGS = ("no-log", "audit-log", "receipts")
SAMPLE_RECEIPT = ""  # the receipt `sizes` fetched, for `components`


def gateway_lines(config: str, folder: Path) -> str:
    if config == "no-log":
        return ""
    log = f"""  audit_log:
    path: {folder / config / "audit.jsonl"}
    key: {{env: KVFENCE_BENCH_AUDIT_KEY}}
    fsync: batch
"""
    if config == "audit-log":
        return log
    return (
        log
        + f"""    checkpoints: {{name: bench.kvfence/log, key: {{file: {folder / "log.key"}}}}}
  receipts:
    path: {folder / "store"}
    keys: [{{id: r1, private_key: {{file: {folder / "r1.key"}}}, active: true}}]
"""
    )


def components(n: int = 2000) -> dict[str, float]:
    """In-process CPU of the receipt's own steps (microseconds each): the document canonicalised
    (RFC 8785), signed, and the tree's leaf and node hashes; the file and the two thread hand-offs
    are in the end-to-end figure only."""
    import timeit

    from kvfence.receipts.jcs import canonical
    from kvfence.receipts.merkle import leaf_hash, node_hash
    from kvfence.receipts.receipt import sign

    key = generate_key()
    doc = json.loads(SAMPLE_RECEIPT)
    doc.pop("signature")
    line = b"x" * 700

    def signed() -> None:
        sign(dict(doc), "r1", key)

    return {
        "canonical_json_us": round(timeit.timeit(lambda: canonical(doc), number=n) / n * 1e6, 1),
        "canonical_and_sign_us": round(timeit.timeit(signed, number=n) / n * 1e6, 1),
        "tree_append_us": round(
            timeit.timeit(lambda: node_hash(leaf_hash(line), leaf_hash(line)), number=n) / n * 1e6,
            1,
        ),
    }


def _get(port: int, key: str, path: str) -> bytes:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", headers={"authorization": f"Bearer {key}"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return bytes(answer.read())


def sizes(port: int, key: str, folder: Path) -> dict[str, Any]:
    """One more answer through the receipts gateway: its receipt, proof and the key set."""
    body = scenarios()["small"].body
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=body,
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        receipt_id = answer.headers["x-kvfence-receipt-id"]
    receipt = _get(port, key, f"/v1/kvfence/receipts/{receipt_id}")
    global SAMPLE_RECEIPT
    SAMPLE_RECEIPT = receipt.decode()
    proof = _get(port, key, f"/v1/kvfence/receipts/{receipt_id}/proof")
    stored = list((folder / "store").glob("*/*.json"))
    tree = folder / "receipts" / "audit.jsonl.tree"
    head, _, note = proof.decode().partition("\n\n")
    lines = head.split("\n")
    entries = int(note.split("\n")[1])
    return {
        "receipt_bytes": len(receipt),
        "proof_bytes": len(proof),
        "proof_hashes": len(lines) - 3,
        "proof_record_b64_bytes": len(lines[1]) - len("extra "),
        "checkpoint_note_bytes": len(note),
        "log_entries_at_proof": entries,
        "keyset_bytes": len(_get(port, key, "/v1/kvfence/keys")),
        "stored_receipt_bytes_mean": round(sum(p.stat().st_size for p in stored) / len(stored)),
        "stored_receipts": len(stored),
        "tree_bytes_per_entry": round(tree.stat().st_size / entries, 1),
    }


async def campaign(
    bench: Bench, gateways: dict[str, Bench], rates: Sequence[int], names: Sequence[str]
) -> list[dict[str, Any]]:
    """`gateways`: the bench aimed at each configuration's gateway (its server and key)."""
    table = scenarios()
    await bench.measure(table["small"], "direct", 200, 1.0)
    for via in gateways.values():  # warm each gateway up
        await via.measure(table["small"], "gateway", 300, 1.0)
    print(HEADER, file=sys.stderr)
    out = []
    for name in names:
        for rate in rates:
            direct = await bench.measure(table[name], "direct", rate)
            print(row(direct, None), file=sys.stderr)
            runs: dict[str, Point] = {}
            for config, via in gateways.items():
                runs[config] = await via.measure(table[name], "gateway", rate)
                print(f"{config:>10} " + row(runs[config], added(direct, runs[config])),
                      file=sys.stderr)  # fmt: skip
            out.append(_compare(name, rate, direct, runs))
    return out


def _compare(name: str, rate: int, direct: Point, runs: dict[str, Point]) -> dict[str, Any]:
    on, off = runs["receipts"], runs["audit-log"]
    cpu = None
    if on.gateway_cpu_us is not None and off.gateway_cpu_us is not None:
        cpu = round(on.gateway_cpu_us - off.gateway_cpu_us, 1)
    return {
        "scenario": name,
        "rate": rate,
        "direct": dataclasses.asdict(direct),
        **{
            config: dataclasses.asdict(point) | added(direct, point)
            for config, point in runs.items()
        },
        "receipts_cost": {
            "gateway_cpu_us_per_request": cpu,
            "p50_ms": round(on.p50_ms - off.p50_ms, 3),
            "p99_ms": round(on.p99_ms - off.p99_ms, 3),
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rates", type=int, nargs="+", default=[200, 500])
    parser.add_argument("--scenarios", nargs="+", default=["small", "small-sse"])
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument(
        "--nice", type=int, default=0, help="nice value for every process (e.g. -10; needs root)"
    )
    args = parser.parse_args(argv)
    cores = (1, 0) if (os.cpu_count() or 1) >= 2 else (0, 0)
    started = time.time()
    env = {"KVFENCE_BENCH_AUDIT_KEY": secrets.token_urlsafe(32)}
    with contextlib.ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kvfence-rcpt-")))
        for name in ("log", "r1"):
            write_private_key(folder / f"{name}.key", generate_key())
        for sub in (*CONFIGS, "store"):
            (folder / sub).mkdir(exist_ok=True, mode=0o700)
        up = stack.enter_context(procs.upstream(cores[1], args.nice))
        gateways: dict[str, tuple[procs.Server, str]] = {}
        for config in CONFIGS:
            lines = gateway_lines(config, folder)
            gateways[config] = stack.enter_context(
                procs.gateway(up.port, cores[0], args.nice, gateway_lines=lines, env_extra=env)
            )
        procs.place(cores[1], args.nice)
        server, key = gateways["no-log"]
        bench = Bench(up, server, key, args.duration, args.warmup, *cores)
        aimed = {c: dataclasses.replace(bench, gateway=s, key=k) for c, (s, k) in gateways.items()}
        results = uvloop.run(campaign(bench, aimed, args.rates, args.scenarios))
        measured = sizes(gateways["receipts"][0].port, gateways["receipts"][1], folder)
    result = {
        "machine": machine(),
        "setup": {
            "gateway": "kvfence gateway --workers 1, access_log: false; audit log fsync: batch",
            "configs": list(CONFIGS),
            "receipts_cost": "receipts minus audit-log: the witnessed log, the receipt's "
            "canonical JSON, signature and file",
            "duration_s": args.duration,
            "nice": args.nice,
            "wall_s": round(time.time() - started, 1),
        },
        "runs": results,
        "sizes": measured,
        "components": components(),
        "load_average": Path("/proc/loadavg").read_text().split()[:3],
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    costs = [r["receipts_cost"] | {"scenario": r["scenario"], "rate": r["rate"]} for r in results]
    print(json.dumps([*costs, measured, result["components"]], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
