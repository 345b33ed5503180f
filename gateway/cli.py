"""`kvfence gateway --policy FILE [--host] [--port] [--admin-port] [--workers N]`.

With N > 1 the parent forks N workers that share the port through SO_REUSEPORT, passes SIGTERM,
SIGINT and SIGHUP on to them, and stops them all when one exits. Workers die with their parent:
the kernel sends them SIGTERM when it dies (Linux `PR_SET_PDEATHSIG`), and each also checks that
its parent is still the process that forked it (at start, since that signal races the fork,
and then every second), so a killed parent never leaves workers serving behind it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Final

from gateway.app import create_app
from gateway.audit.chain.format import worker_path
from gateway.audit.chain.lock import check_free
from gateway.audit.chain.log import AuditWriteError
from gateway.audit.trace import missing_support as missing_tracing
from gateway.control.service import missing_support as missing_control
from gateway.metrics import prepare_shared, share_values, worker_exited
from gateway.policy.load import load_policy
from gateway.policy.model import Policy
from gateway.policy.node import PolicyError
from gateway.preflight import problems
from gateway.server import bound_port, start, start_admin
from gateway.shared import missing_support
from gateway.verify.service import remove_state_dir, state_dir_for
from gateway.verify.tokens import load_problem as tokenizer_problem
from kvfence import heap
from kvfence.listen import ListenError, check_listen
from kvfence.logs import configure_logging

log = logging.getLogger("kvfence.gateway")
PR_SET_PDEATHSIG: Final = 1
PARENT_CHECK_S: Final = 1.0
GENERATION = time.time()  # this start of the gateway; forked workers inherit it


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", required=True, help="policy YAML file")
    parser.add_argument("--host", help="override gateway.listen.host")
    parser.add_argument("--port", type=int, help="override gateway.listen.port")
    parser.add_argument("--admin-port", type=int, help="override gateway.admin.port")
    parser.add_argument("--workers", type=int, default=1, help="processes sharing the port")
    parser.add_argument("--log-level", default="info", help="debug, info, warning, error")


async def _orphaned(parent: int | None, stop: asyncio.Event) -> None:
    while parent is not None and not stop.is_set():
        await asyncio.sleep(PARENT_CHECK_S)
        if os.getppid() != parent:
            log.warning("parent gone: stopping", extra={"pid": os.getpid()})
            stop.set()


async def _serve(
    args: argparse.Namespace, worker: int | None, parent: int | None, state_dir: Path | None
) -> None:
    policy = load_policy(args.policy)
    app = create_app(
        policy,
        reload_from=Path(args.policy),
        worker=worker,
        state_dir=state_dir,
        generation=GENERATION,
        shared_metrics=None if state_dir is None else metrics_dir(state_dir),
    )
    host = args.host or policy.gateway.listen.host
    port = policy.gateway.listen.port if args.port is None else args.port
    runner = await start(app, host, port, reuse_port=worker is not None)
    admin = policy.gateway.admin
    admin_port = admin.port if args.admin_port is None else args.admin_port
    admin_runner = await start_admin(app, admin.host, admin_port, reuse_port=worker is not None)
    heap.loaded()  # what serving keeps for life, out of every later collection
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
    watchdog = asyncio.create_task(_orphaned(parent, stop))
    try:
        await stop.wait()
    finally:
        watchdog.cancel()
        await admin_runner.cleanup()
        await runner.cleanup()


def _run(
    args: argparse.Namespace,
    worker: int | None,
    parent: int | None = None,
    state_dir: Path | None = None,
) -> int:
    """Serve until stopped; 2 with one line on stderr when the gateway cannot start (its audit
    log is held by another process, or cannot be opened)."""
    try:
        import uvloop
    except ImportError:
        runner = asyncio.run
    else:
        runner = uvloop.run
    try:
        runner(_serve(args, worker, parent, state_dir))
    except (AuditWriteError, OSError) as exc:
        print(f"kvfence gateway: refusing to start: {exc}", file=sys.stderr)
        return 2
    return 0


def _die_with(parent: int) -> None:
    """Ask the kernel for SIGTERM when the parent dies; exit now if it already has."""
    if sys.platform.startswith("linux"):  # the process's own symbols include libc's prctl
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # died before the request took effect
        raise SystemExit(0)


def _child(args: argparse.Namespace, worker: int, parent: int, state_dir: Path) -> int:
    """A worker; a stop signal that arrives before its event loop runs still exits cleanly."""

    def early_stop(_sig: int, _frame: object) -> None:
        raise SystemExit(0)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, early_stop)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # until the app's own handler is installed
    try:
        _die_with(parent)
        share_values(metrics_dir(state_dir))
        return _run(args, worker, parent, state_dir)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:  # a forked child must never return into the parent's code
        print(f"kvfence gateway: worker {worker} failed: {type(exc).__name__}", file=sys.stderr)
        return 1


def _fork_workers(args: argparse.Namespace) -> int:
    # One state directory for all workers (a private temp one unless the policy names one):
    # made here so every worker opens the same one, and removed by this process.
    state_dir, temporary = state_dir_for(load_policy(args.policy))
    try:
        return _supervise(args, state_dir)
    finally:
        if temporary:
            remove_state_dir(state_dir)


def metrics_dir(state_dir: Path) -> Path:
    """Where the workers' metric values live (summed by whichever worker is scraped)."""
    return state_dir / "metrics"


def _supervise(args: argparse.Namespace, state_dir: Path) -> int:
    parent, children = os.getpid(), []
    prepare_shared(metrics_dir(state_dir))
    with heap.forking():  # the workers share the parent's pages, left unwritten
        for worker in range(1, args.workers + 1):
            pid = os.fork()
            if pid == 0:
                os._exit(_child(args, worker, parent, state_dir))
            children.append(pid)

    def forward(sig: int, _frame: object) -> None:
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    status, alive = 0, set(children)
    while alive:
        pid, code = os.wait()
        if pid not in alive:
            continue
        alive.discard(pid)
        worker_exited(metrics_dir(state_dir), pid)
        status = status or os.waitstatus_to_exitcode(code)
        if alive and status:  # one worker failed: stop the others rather than run short
            log.warning("worker exited: stopping", extra={"pid": pid, "status": status})
            forward(signal.SIGTERM, None)
    return abs(status)


def _check_free(args: argparse.Namespace, policy: Policy) -> None:
    """No other process writes the audit chains (a second gateway: it names its pid), and
    both ports can be listened on."""
    audit = policy.gateway.audit_log
    workers = [None] if args.workers == 1 else list(range(1, args.workers + 1))
    for worker in workers:
        if audit is not None:
            check_free(worker_path(audit.path, worker))
    listen, admin = policy.gateway.listen, policy.gateway.admin
    host, port = args.host or listen.host, listen.port if args.port is None else args.port
    admin_port = admin.port if args.admin_port is None else args.admin_port
    if port and port == admin_port:
        raise ListenError(
            f"the gateway and its admin listener both want port {port}: give them two "
            "(--port / gateway.listen.port, --admin-port / gateway.admin.port)"
        )
    check_listen(host, port, "the gateway", "choose another with --port or gateway.listen.port")
    fix = "choose another with --admin-port or gateway.admin.port"
    check_listen(admin.host, admin_port, "the admin listener", fix)


def main(args: argparse.Namespace) -> int:
    configure_logging(args.log_level)
    if found := problems():
        for problem in found:
            print(f"kvfence gateway: refusing to start: {problem}", file=sys.stderr)
        return 2
    try:
        policy = load_policy(args.policy)
    except PolicyError as exc:
        print("\n".join(exc.errors), file=sys.stderr)
        return 1
    if args.workers < 1:
        print("kvfence gateway: --workers must be at least 1", file=sys.stderr)
        return 2
    missing = missing_support(policy) or missing_tracing(policy) or missing_control(policy)
    if missing := missing or tokenizer_problem(policy):
        print(f"kvfence gateway: refusing to start: {missing}", file=sys.stderr)
        return 2
    try:  # one line now, rather than one per worker later
        _check_free(args, policy)
    except (AuditWriteError, ListenError) as exc:
        print(f"kvfence gateway: refusing to start: {exc}", file=sys.stderr)
        return 2
    if args.workers == 1:
        return _run(args, None)
    return _fork_workers(args)
