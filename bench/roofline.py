"""Batch-1 decode against the memory roofline, measured in one process: the host's copy bandwidth
(torch copy of a buffer far larger than the caches), the bytes one decoded token reads (every
matrix of the decoder and the logits head as the model holds them, plus the KV it attends over),
and the runner's batch-1 decode rate; the roofline is bandwidth / bytes per token.

Invariant: the bandwidth is measured with the thread count the decode runs with, right before
it; copy bandwidth counts the bytes read plus the bytes written (STREAM's convention).

    .venv/bin/python -m bench.roofline [--dtype auto] [--threads 2]  # prints one JSON
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

# The backend first: it sets the OpenMP settings the server runs with, which hold only if set
# before torch loads (see backend/__init__.py); torch is imported in the functions.
from backend.model import LoadedModel, load_model
from backend.runner import ModelRunner
from bench.runner_speed import BLOCK, TOPICS, decode_rate, prompt_ids, sync

COPY_MIB = 1024  # far beyond any last-level cache of this class of host


def copy_bandwidth(mib: int = COPY_MIB, repeats: int = 7, device: str = "cpu") -> dict[str, float]:
    """GB/s of a torch copy (read + write) on `device`, median and best of `repeats`."""
    import torch

    src = torch.ones(mib << 20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch: page faults are not bandwidth
    rates = []
    for _ in range(repeats):
        sync(src.device)
        start = time.perf_counter()
        dst.copy_(src)
        sync(src.device)
        rates.append(2 * src.numel() / (time.perf_counter() - start) / 1e9)
    return {"copy_gb_s": round(statistics.median(rates), 2), "copy_gb_s_best": round(max(rates), 2)}


def kv_bytes_per_token(loaded: LoadedModel, context: int) -> int:
    """Bytes of K and V one decode step reads at `context` positions (whole blocks gathered)."""
    c = loaded.config
    span = -(-context // BLOCK) * BLOCK
    return 2 * c.n_layers * span * c.n_kv_heads * c.head_dim * loaded.dtype.itemsize


def measure(loaded: LoadedModel, steps: int, runs: int) -> dict[str, Any]:
    import torch

    runner = ModelRunner(loaded, num_blocks=256, block_size=BLOCK)
    with torch.inference_mode():
        decode_rate(runner, loaded, 1, 8)  # warm-up
        bandwidth = copy_bandwidth()
        rates = [decode_rate(runner, loaded, 1, steps) for _ in range(runs)]
    prompt = len(prompt_ids(loaded, TOPICS[0]))
    weights = loaded.model.decode_weight_bytes()
    kv = kv_bytes_per_token(loaded, prompt + steps // 2)  # the mean context of the timed steps
    roofline = bandwidth["copy_gb_s"] * 1e9 / (weights + kv)
    roofline_best = bandwidth["copy_gb_s_best"] * 1e9 / (weights + kv)
    decode = statistics.median(rates)
    return {
        **bandwidth,
        "weight_bytes_per_token": weights,
        "kv_bytes_per_token": kv,
        "roofline_tokens_per_s": round(roofline, 1),
        "decode_tokens_per_s_batch1": round(decode, 1),
        "decode_tokens_per_s_batch1_best": round(max(rates), 1),
        "decode_share_of_roofline": round(decode / roofline, 3),
        # Best against best: what the host gives when other work leaves both cores alone.
        "roofline_tokens_per_s_best": round(roofline_best, 1),
        "decode_share_of_roofline_best": round(max(rates) / roofline_best, 3),
        "decode_steps": steps,
        "runs": runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    loaded = load_model(args.model, dtype=args.dtype)
    out: dict[str, Any] = {"dtype": str(loaded.dtype).removeprefix("torch.")}
    out |= {"threads": args.threads, "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")}
    out |= {"gomp_spincount": os.environ.get("GOMP_SPINCOUNT")}
    out |= measure(loaded, args.steps, args.runs)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
