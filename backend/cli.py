"""`kvfence backend`: load the model, build the engine and serve it over HTTP.

Invariant: start-up fails with one clear line and a non-zero exit on any bad input (model path,
key or trust file); nothing is served until the model, keys and engine are all in place.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from backend.engine.plan import PREFILL_POLICIES
from backend.model.errors import ModelLoadError
from kvfence import heap
from kvfence.keys.keyfile import KeyFileError
from kvfence.listen import ListenError, check_listen

if TYPE_CHECKING:
    from aiohttp import web

    from backend.threads import ThreadGovernor

    Governed = tuple[ThreadGovernor | None, str]  # the governor, or None and why not

log = logging.getLogger("kvfence.backend")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2", help="smollm2, a .gguf file or an HF dir")
    parser.add_argument("--served-name", default=None, help="model name clients use")
    parser.add_argument("--revision", default="1", help="model revision handles must name")
    parser.add_argument(
        "--trust", required=True, type=Path, help="trust file of the keys that may sign handles"
    )
    parser.add_argument(
        "--signing-key",
        required=True,
        type=Path,
        help="this backend's Ed25519 private key (PEM) for attestations",
    )
    parser.add_argument(
        "--key-id",
        default=None,
        help="key id of --signing-key in trust files (default: its file name)",
    )
    parser.add_argument("--id", default="kvfence-backend", help="audience handles must name")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="auto: bfloat16 where the hardware runs it natively, else float32",
    )
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--kv-blocks", type=int, default=4096)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument(
        "--max-step-tokens", type=int, default=512, help="tokens one step computes at most"
    )
    parser.add_argument(
        "--prefill-policy",
        default="fill",
        choices=list(PREFILL_POLICIES),
        help="fill: split the next prompt to fill a step; whole: split only a prompt that "
        "cannot complete in a step of its own",
    )
    parser.add_argument(
        "--max-share",
        type=float,
        default=1.0,
        help="the largest share of KV blocks any tenant may hold (caps what handles ask for)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument(
        "--no-cuda-graphs",
        action="store_true",
        help="on a GPU, run steps of decodes alone as every other step, not as CUDA graphs",
    )
    parser.add_argument(
        "--fixed-threads",
        action="store_true",
        help="keep --threads whatever the host's load (default: fewer while other work takes "
        "the cores, where the kernels give the same bits at every count)",
    )
    parser.add_argument("--log-level", default="info")


def main(args: argparse.Namespace) -> int:
    from kvfence.logs import configure_logging

    configure_logging(args.log_level)
    try:  # before the model loads: a busy port is one line, not a traceback after "ready"
        check_listen(args.host, args.port, "the backend", "choose another with --port")
        app = build(args)
    except (ModelLoadError, KeyFileError, ListenError, ValueError) as exc:
        print(f"kvfence backend: {exc}", file=sys.stderr)
        return 2
    heap.loaded()  # the model, tokenizer and engine, out of every later collection
    from aiohttp import web

    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    web.run_app(
        app, host=args.host, port=args.port, handler_cancellation=True, access_log=None, print=None
    )
    return 0


def build(args: argparse.Namespace) -> web.Application:
    import torch

    from backend.engine.engine import Engine, EngineConfig
    from backend.model.load import LoadedModel, load_model
    from backend.runner import ModelRunner
    from backend.server import create_app
    from backend.service import Backend, ServedModel
    from backend.thread_probe import agree, thread_counts
    from backend.threads import ThreadGovernor, readable
    from backend.worker import EngineWorker
    from kvfence.attestation import AttestationSigner
    from kvfence.handle import HandleVerifier
    from kvfence.keys.keyfile import TrustStore, load_private_key

    trust = TrustStore.from_file(args.trust)
    signing_key = load_private_key(args.signing_key)
    config = EngineConfig(
        num_blocks=args.kv_blocks,
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_step_tokens=args.max_step_tokens,
        max_share=args.max_share,
        prefill_policy=args.prefill_policy,
    )

    def build_engine() -> tuple[Engine, tuple[LoadedModel, ModelRunner, int, Governed]]:
        # Runs on the engine thread, so the weights and every step share one OpenMP pool, and
        # the governor's thread counts are this thread's (OpenMP keeps them per thread).
        if args.threads:
            torch.set_num_threads(args.threads)
        loaded = load_model(args.model, device=args.device, dtype=args.dtype)
        runner = ModelRunner(
            loaded,
            num_blocks=args.kv_blocks,
            block_size=args.block_size,
            max_batch=args.max_num_seqs,
            graphs=False if args.no_cuda_graphs else None,
        )
        threads = torch.get_num_threads()
        return Engine(runner, config), (loaded, runner, threads, governed(runner, threads))

    def governed(runner: ModelRunner, threads: int) -> Governed:
        """The engine's thread governor, or None and why its thread count stays."""
        if args.fixed_threads:
            return None, "--fixed-threads"
        if runner.device.type != "cpu" or threads < 2:
            return None, "one thread or not a CPU"
        if not readable():
            return None, "this host does not report its CPU time (/proc/stat, /proc/self/stat)"
        if not agree(runner, thread_counts(threads)):
            return None, "this host's kernels give other bits at another thread count"
        return ThreadGovernor(threads, torch.set_num_threads), ""

    worker, (loaded, runner, threads, (governor, fixed)) = EngineWorker.boot(build_engine)
    worker.start_threads, worker.governor = threads, governor
    name = args.served_name or loaded.name
    model = ServedModel(name, args.revision, loaded.config.max_positions)
    signer = AttestationSigner(signing_key, args.key_id or args.signing_key.stem, args.id)
    backend = Backend(worker, loaded.tokenizer, model, HandleVerifier(trust, args.id), signer)
    if not runner.pool.plan.invariant:
        log.warning(
            "this host's attention kernel gives a decode other bits in another batch: "
            "answers may depend on what shares their steps",
            extra={"kernels": runner.kernel_plans()},
        )
    log.info(
        "backend ready to serve",
        extra={
            "model": name,
            "device": str(loaded.device),
            "dtype": str(loaded.dtype).removeprefix("torch."),
            "dtype_reason": loaded.dtype_reason,
            "kernels": runner.kernel_plans(),
            "threads": threads,
            "threads_fixed_because": fixed or None,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"),
            "max_step_tokens": args.max_step_tokens,
            "prefill_policy": args.prefill_policy,
            "kv_blocks": args.kv_blocks,
            "kv_bytes": runner.kv_cache_bytes(),
            "audience": args.id,
        },
    )
    return create_app(backend)
