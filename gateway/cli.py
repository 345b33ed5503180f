"""`kvfence gateway --policy FILE [--host] [--port] [--workers N]`.

With N > 1 the parent forks N workers that share the port through SO_REUSEPORT and passes
SIGTERM, SIGINT and SIGHUP on to them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from pathlib import Path

from gateway.app import create_app
from gateway.policy.load import load_policy
from gateway.policy.node import PolicyError
from gateway.preflight import problems
from gateway.server import bound_port, start, start_admin
from gateway.verify.service import remove_state_dir, state_dir_for
from kvfence.logs import configure_logging

log = logging.getLogger("kvfence.gateway")
GENERATION = time.time()  # this start of the gateway; forked workers inherit it


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", required=True, help="policy YAML file")
    parser.add_argument("--host", help="override gateway.listen.host")
    parser.add_argument("--port", type=int, help="override gateway.listen.port")
    parser.add_argument("--workers", type=int, default=1, help="processes sharing the port")
    parser.add_argument("--log-level", default="info", help="debug, info, warning, error")


async def _serve(
    args: argparse.Namespace, worker: int | None, state_dir: Path | None, generation: float
) -> None:
    policy = load_policy(args.policy)
    app = create_app(
        policy,
        reload_from=Path(args.policy),
        worker=worker,
        state_dir=state_dir,
        generation=generation,
    )
    host = args.host or policy.gateway.listen.host
    port = policy.gateway.listen.port if args.port is None else args.port
    runner = await start(app, host, port, reuse_port=worker is not None)
    admin = policy.gateway.admin
    admin_runner = await start_admin(app, admin.host, admin.port, reuse_port=worker is not None)
    log.info(
        "serving",
        extra={
            "host": host,
            "port": bound_port(runner),
            "admin": f"{admin.host}:{bound_port(admin_runner)}",
            "pid": os.getpid(),
        },
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await admin_runner.cleanup()
        await runner.cleanup()


def _run(args: argparse.Namespace, worker: int | None, state_dir: Path | None = None) -> None:
    serve = _serve(args, worker, state_dir, GENERATION)
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve)
    else:
        uvloop.run(serve)


def _child(args: argparse.Namespace, worker: int, state_dir: Path) -> int:
    """A worker; a stop signal that arrives before its event loop runs still exits cleanly."""

    def early_stop(_sig: int, _frame: object) -> None:
        raise SystemExit(0)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, early_stop)
    try:
        _run(args, worker, state_dir)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0


def _fork_workers(args: argparse.Namespace) -> int:
    # One verification state directory for all workers (a private temp one unless the policy
    # names one); made here so every worker opens the same one, and removed by this process.
    state_dir, temporary = state_dir_for(load_policy(args.policy))
    try:
        return _supervise(args, state_dir)
    finally:
        if temporary:
            remove_state_dir(state_dir)


def _supervise(args: argparse.Namespace, state_dir: Path) -> int:
    children: list[int] = []
    for worker in range(1, args.workers + 1):
        pid = os.fork()
        if pid == 0:
            os._exit(_child(args, worker, state_dir))
        children.append(pid)

    def forward(sig: int, _frame: object) -> None:
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    status = 0
    for child in children:
        _, code = os.waitpid(child, 0)
        status = status or os.waitstatus_to_exitcode(code)
    return status


def main(args: argparse.Namespace) -> int:
    configure_logging(args.log_level)
    if found := problems():
        for problem in found:
            print(f"kvfence gateway: refusing to start: {problem}", file=sys.stderr)
        return 2
    try:
        load_policy(args.policy)
    except PolicyError as exc:
        print("\n".join(exc.errors), file=sys.stderr)
        return 1
    if args.workers < 1:
        print("kvfence gateway: --workers must be at least 1", file=sys.stderr)
        return 2
    if args.workers == 1:
        _run(args, None)
        return 0
    return _fork_workers(args)
