"""One command on a GPU machine: our engine (reference answer, batched == alone, isolation,
throughput at each stream count with and without a prefix hit, decode steps as CUDA graphs and
the same misses without them), the same model in transformers beside it, batch-1 decode against
the device's bandwidth roofline, our decode attention against a gathering copy, and the gateway
in front of our backend (1 and N workers, its cost, isolation, the audit log verified). Writes
one JSON (rewritten after every section, so a run cut short keeps what it measured) and prints a
table.

    python -m bench.gpu.check [--model smollm2|FILE|DIR] [--device cuda] [--out FILE]
    python -m bench.gpu.check --device cpu --streams 1 2 --max-tokens 8 --workers 1 2 \\
        --gateway-streams 2 --graphs on --skip-transformers-if-missing   # the CPU rehearsal
"""

from __future__ import annotations

import argparse
import gc
import json
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The backend first: it sets the OpenMP settings that hold only if set before torch loads.
from backend.model import LoadedModel, load_model
from backend.runner import ModelRunner
from bench.gpu import attention, hf, stack, summary
from bench.gpu import engine as ours
from bench.machine import describe
from bench.roofline import copy_bandwidth, kv_bytes_per_token
from bench.runner_speed import BLOCK, TOPICS, decode_rate, prompt_ids

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "gpu_check.json"
STARTED = time.monotonic()


GRAPHS = {"auto": None, "on": True, "off": False}  # --graphs -> ModelRunner(graphs=...)


def progress(message: str) -> None:
    print(f"[{time.monotonic() - STARTED:6.1f} s] {message}", flush=True)


def left(args: argparse.Namespace) -> float:
    return float(args.budget_s) - (time.monotonic() - STARTED)


def engine_section(args: argparse.Namespace, loaded: LoadedModel) -> dict[str, Any]:
    engine, made = ours.make_engine(loaded, max(128, *args.streams), GRAPHS[args.graphs])
    progress(f"engine: decode steps by {made['decode_steps']}, {made['runner_start_s']} s to start")
    progress("engine: reference answer, batched == alone, isolation")
    found: dict[str, Any] = {"dtype": str(loaded.dtype).removeprefix("torch.")}
    found["dtype_reason"] = loaded.dtype_reason
    found["runner"] = made
    found["checks"] = ours.checks(engine, loaded, args.max_tokens)
    ours.generate(engine, loaded.device, [("warm", ours.row_prompts(loaded, 1)[0])] * 8, 8)
    rows, skipped = [], []
    for streams in args.streams:
        for hit in (False, True):
            if left(args) < args.reserve_s:
                skipped.append({"streams": streams, "prefix": "hit" if hit else "miss"})
                continue
            rows.append(ours.throughput_row(engine, loaded, streams, hit, args.max_tokens))
            r = rows[-1]
            progress(
                f"engine: {streams} streams, {r['prefix']}: {r['tokens_per_s']} tok/s, "
                f"first tokens {r['all_first_tokens_ms']} ms, cached {r['cached_tokens']}"
            )
    found["throughput"], found["skipped_for_time"] = rows, skipped
    if made["decode_steps"] != "usual path" and left(args) > args.reserve_s:
        del engine
        usual = [s for s in (1, 8, 64) if s in args.streams] or args.streams[:1]
        progress(f"engine: the same misses without CUDA graphs at {usual} streams")
        found["usual_path"] = ours.usual_path_rows(loaded, rows, usual, args.max_tokens)
        for r in found["usual_path"]["rows"]:
            progress(
                f"engine: {r['streams']} streams without graphs: {r['tokens_per_s']} tok/s "
                f"(with: {r['graphs_tokens_per_s']}), same tokens: {r['same_tokens']}"
            )
    return found


def roofline_section(args: argparse.Namespace, loaded: LoadedModel) -> dict[str, Any]:
    progress(f"roofline: copy of {args.copy_mib} MiB on {loaded.device}, batch-1 decode")
    import torch

    graphs = GRAPHS[args.graphs]  # batch 1 only: one graph size is all it needs
    runner = ModelRunner(loaded, num_blocks=256, block_size=BLOCK, max_batch=1, graphs=graphs)
    usual = ModelRunner(loaded, num_blocks=256, block_size=BLOCK, graphs=False)
    with torch.inference_mode():
        decode_rate(runner, loaded, 1, 4)  # warm-up
        decode_rate(usual, loaded, 1, 4)
        bandwidth = copy_bandwidth(args.copy_mib, device=str(loaded.device))
        rates = [decode_rate(runner, loaded, 1, args.decode_steps) for _ in range(3)]
        usual_rates = [decode_rate(usual, loaded, 1, args.decode_steps) for _ in range(3)]
    context = len(prompt_ids(loaded, TOPICS[0])) + args.decode_steps // 2
    weights, kv = loaded.model.decode_weight_bytes(), kv_bytes_per_token(loaded, context)
    decode = sorted(rates)[1]
    return {
        **bandwidth,
        "weight_bytes_per_token": weights,
        "kv_bytes_per_token": kv,
        "decode_steps": args.decode_steps,
        "decode_runs_tokens_per_s": [round(r, 1) for r in rates],
        "decode_steps_by": runner.decode_steps,
        "usual_path_decode_runs_tokens_per_s": [round(r, 1) for r in usual_rates],
        **summary.roofline(bandwidth["copy_gb_s"], weights, kv, decode),
    }


def attention_section(args: argparse.Namespace, loaded: LoadedModel) -> dict[str, Any]:
    """Our decode kernel against the usual path's gather and torch attention, call by call."""
    import torch

    from backend.model import paged_gpu

    reason = paged_gpu.available(loaded.device, loaded.dtype, loaded.config.head_dim)
    if reason is not None:
        return {"skipped": f"our decode kernel does not run here: {reason}"}
    with torch.inference_mode():
        found = attention.rows(
            loaded.config, loaded.device, loaded.dtype, args.attention_batches,
            args.attention_contexts, args.attention_repeats,
        )  # fmt: skip
    for r in found:
        progress(
            f"attention: batch {r['batch']}, context {r['context']}: ours {r['ours_us']} us, "
            f"gathered {r['gathered_us']} us (answers apart by {r['largest_difference']})"
        )
    return {"rows": found}


def transformers_section(args: argparse.Namespace, loaded: LoadedModel) -> dict[str, Any]:
    try:
        import transformers
    except ImportError:
        if args.skip_transformers_if_missing:
            return {"skipped": "transformers is not installed"}
        raise
    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    progress(f"transformers {transformers.__version__}: loading {args.hf_model or args.model}")
    model = hf.load_hf(args.hf_model or args.model, loaded)
    pad = loaded.tokenizer.eos_ids[0] if loaded.tokenizer.eos_ids else 0
    hf.generate(model, ours.row_prompts(loaded, 2), 4, pad)  # warm-up
    rows = []
    for streams in args.streams:
        if left(args) < args.reserve_s:
            break
        rows.append(hf.row(model, ours.row_prompts(loaded, streams), args.max_tokens, pad))
        progress(f"transformers: {streams} streams: {rows[-1]['tokens_per_s']} tok/s")
    del model
    return {"version": transformers.__version__, "rows": rows}


def agreement(report: dict[str, Any]) -> None:
    """Moves the token ids out of the rows into one figure: leading greedy tokens alike at the
    smallest stream count."""
    mine = [r.pop("first_stream_ids") for r in report.get("engine", {}).get("throughput", ())]
    theirs = [r.pop("first_stream_ids") for r in report.get("transformers", {}).get("rows", ())]
    if mine and theirs:
        report["transformers"]["greedy_tokens_alike"] = hf.agreeing_prefix(mine[0], theirs[0])


def write(report: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")


def section(
    report: dict[str, Any], name: str, out: Path, run: Callable[[], dict[str, Any]]
) -> None:
    """Runs one section into the report; a failure is recorded there (and fails the run at the
    end), the next section still runs."""
    try:
        report[name] = run()
    except Exception as exc:  # a one-shot run on a lent machine: keep every other section
        progress(f"{name}: FAILED: {exc!r}")
        report[name] = {"error": repr(exc), "traceback": traceback.format_exc().splitlines()[-12:]}
    report["elapsed_s"] = round(time.monotonic() - STARTED, 1)
    write(report, out)


def in_process(args: argparse.Namespace, report: dict[str, Any], out: Path) -> None:
    """The sections that run in this process, on one loaded model."""
    import torch

    progress(f"loading {args.model} on {args.device}")
    loaded = load_model(args.model, device=args.device, dtype=args.dtype)
    cuda = loaded.device.type == "cuda"
    report["device"] = torch.cuda.get_device_name(loaded.device) if cuda else "cpu"
    section(report, "engine", out, lambda: engine_section(args, loaded))
    section(report, "roofline", out, lambda: roofline_section(args, loaded))
    section(report, "attention", out, lambda: attention_section(args, loaded))
    section(report, "transformers", out, lambda: transformers_section(args, loaded))
    agreement(report)
    if cuda:
        report["gpu_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)


def main() -> None:
    args = parse_args()
    import torch

    out = Path(args.out)
    report: dict[str, Any] = {
        "machine": describe(),
        "torch": torch.__version__,
        "options": vars(args),
    }
    in_process(args, report, out)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the backend process needs the device next
    section(report, "gateway", out, lambda: stack.run(args, args.model, progress))
    report["goals"] = summary.goals(report)
    write(report, out)
    print("\n" + summary.render(report), flush=True)
    failed = [k for k, v in report.items() if isinstance(v, dict) and "error" in v]
    raise SystemExit(1 if failed else 0)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2", help="smollm2, a .gguf file or an HF directory")
    p.add_argument("--hf-model", default=None, help="transformers' copy (default: --model's file)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--streams", type=int, nargs="+", default=[1, 8, 32, 64, 128])
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 4])
    p.add_argument("--gateway-streams", type=int, default=64)
    p.add_argument("--gateway-rounds", type=int, default=3)
    p.add_argument("--prompt-words", type=int, default=260, help="gateway prompts, ~300 tokens")
    p.add_argument("--copy-mib", type=int, default=4096, help="the bandwidth copy's buffer")
    p.add_argument("--decode-steps", type=int, default=64)
    p.add_argument("--attention-batches", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--attention-contexts", type=int, nargs="+", default=[256, 2048])
    p.add_argument("--attention-repeats", type=int, default=20, help="calls timed per way")
    p.add_argument(
        "--graphs",
        default="auto",
        choices=list(GRAPHS),
        help="decode steps: auto (CUDA graphs on a GPU), on (static buffers, eager on a CPU), off",
    )
    p.add_argument("--budget-s", type=float, default=400, help="rows past this are skipped")
    p.add_argument("--reserve-s", type=float, default=120, help="time kept for later sections")
    p.add_argument("--skip-transformers-if-missing", action="store_true")
    p.add_argument("--out", default=str(DEFAULT_OUT))
    return p.parse_args()


if __name__ == "__main__":
    main()
