"""Policy reload on SIGHUP and on a change of the policy file or of any file it reads (secrets,
key, trust, digest and prefix files, tokenizers, even one that could not be read yet): a valid
policy swaps in whole, an invalid one is refused, logged and counted, and the running one stays.

Invariant: `PolicyHolder.runtime` is replaced in one assignment; a request reads it once. The
watcher outlives any file content and any error of its own: each failure is one refusal,
logged and counted, and the next change is read as usual.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from aiohttp import web

from gateway.metrics import Metrics
from gateway.policy.load import load_policy
from gateway.policy.model import Policy
from gateway.policy.node import PolicyError
from gateway.policy.registry import Document
from gateway.policy.runtime import Runtime

log = logging.getLogger("kvfence.gateway.reload")
Fingerprint = tuple[int, int, str]


class PolicyHolder:
    """The current runtime, and the registry document it was built with; swapped atomically by
    `Reloader` (a new policy) and the registry watch (a new registry document)."""

    __slots__ = ("registry", "runtime")

    def __init__(self, runtime: Runtime, registry: Document | None = None) -> None:
        self.runtime = runtime
        self.registry = registry

    def swap(self, policy: Policy | None = None, registry: Document | None = None) -> Runtime:
        """Build and install the runtime for `policy` (default: the current one) and `registry`
        (default: the current document)."""
        runtime = Runtime(policy or self.runtime.policy, registry or self.registry)
        self.runtime = runtime
        if registry is not None:
            self.registry = registry
        return runtime


HOLDER = web.AppKey("kvfence_policy_holder", PolicyHolder)


def fingerprint(path: Path) -> Fingerprint | None:
    """mtime, size and content hash (blocking: run in a thread)."""
    try:
        stat = path.stat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None
    return (stat.st_mtime_ns, stat.st_size, digest)


def fingerprints(path: Path, sources: frozenset[Path]) -> tuple[Fingerprint | None, ...] | None:
    """The policy's fingerprint and every source's (None where one is absent); None when the
    policy itself cannot be read (blocking: run in a thread)."""
    own = fingerprint(path)
    if own is None:
        return None
    return (own, *(fingerprint(p) for p in sorted(sources)))


class Reloader:
    def __init__(self, path: Path, holder: PolicyHolder, metrics: Metrics, interval_s: float):
        self.path, self.holder, self.metrics, self.interval_s = path, holder, metrics, interval_s
        self.errors: list[str] = []  # why the last reload was refused (empty after a good one)
        # The files the last load read (or tried to): a change to any of them is a change.
        self._sources = holder.runtime.policy.sources
        # Taken now, at start-up, so an edit made before the watcher's first poll still counts.
        self._seen = fingerprints(path, self._sources)
        self._lock = asyncio.Lock()

    async def reload(self) -> bool:
        async with self._lock:
            # Taken before the load, so an edit made while it runs is read by the next poll.
            before, sources = await asyncio.to_thread(fingerprints, self.path, self._sources), None
            try:
                policy = await asyncio.to_thread(load_policy, self.path)
                sources = policy.sources
                self.holder.swap(policy)
            except PolicyError as exc:
                sources = exc.sources or None
                return self._refused(exc.errors)
            except Exception as exc:  # any failure leaves the old policy in force
                return self._refused([f"{self.path}:0: (file): {type(exc).__name__}"])
            finally:
                await self._follow(before, sources)
            self.errors = []
            self.metrics.reloads.labels("ok").inc()
            log.info("policy reloaded", extra={"summary": policy.summary()})
            return True

    async def _follow(
        self, before: tuple[Fingerprint | None, ...] | None, sources: frozenset[Path] | None
    ) -> None:
        """Watch `sources` from now on (None: the ones watched so far)."""
        if sources is None or sources == self._sources:
            self._seen = before
            return
        self._sources = sources
        now = await asyncio.to_thread(fingerprints, self.path, sources)
        self._seen = None if now is None or before is None else (before[0], *now[1:])

    def _refused(self, errors: list[str]) -> bool:
        self.errors = errors
        self.metrics.reloads.labels("refused").inc()
        log.warning("policy reload refused", extra={"errors": errors[:20]})
        return False

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                current = await asyncio.to_thread(fingerprints, self.path, self._sources)
                if current is not None and current != self._seen:
                    await self.reload()
            except Exception as exc:  # the watcher must not die
                self._refused([f"{self.path}:0: (watcher): {type(exc).__name__}"])


RELOADER = web.AppKey("kvfence_reloader", Reloader)


def reload_ctx(reloader: Reloader) -> Callable[[web.Application], AsyncIterator[None]]:
    """An aiohttp cleanup context running the watcher and the SIGHUP handler."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        task = asyncio.create_task(reloader.watch())
        pending: set[asyncio.Task[bool]] = set()

        def on_hup() -> None:
            hup_task = loop.create_task(reloader.reload())
            pending.add(hup_task)
            hup_task.add_done_callback(pending.discard)

        hup = False
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
            loop.add_signal_handler(signal.SIGHUP, on_hup)
            hup = True
        yield
        if hup:
            loop.remove_signal_handler(signal.SIGHUP)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    return ctx
