"""The registry in the control database for commands run with no gateway answering (`kvfence
tenants ... --offline`, `kvfence audit names`): the same store and rules a gateway uses, each
call one short event loop.

Invariant: an offline change is the same compare-and-set as a gateway's, and honours the state
directory's witness, so it never builds on a database behind what this host has seen.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from gateway.control.engine import ControlRefused, ControlUnavailable, Engine
from gateway.control.registry import DatabaseRegistryStore
from gateway.control.service import engine_for, origin
from gateway.control.sqlite import SqliteEngine
from gateway.control.store import ControlStore
from gateway.control.witness import Witness
from gateway.policy.model import Policy
from gateway.policy.registry import Document, RegistryError, empty_document

T = TypeVar("T")


class OfflineRegistry:
    """`policy`'s registry; or, with `state_dir` and `pepper`, the SQLite one kept there (what
    scripts set up before a gateway starts)."""

    def __init__(
        self,
        policy: Policy | None = None,
        *,
        state_dir: Path | None = None,
        pepper: bytes = b"",
    ) -> None:
        if policy is not None:
            assert policy.registry is not None
            state = policy.gateway.state_dir or Path(".")
            self._engine: Callable[[], Engine] = lambda: engine_for(policy, state)
            self._pepper, self._legacy = policy.gateway.api_key_pepper.value, policy.registry.path
        else:
            assert state_dir is not None and pepper
            state = state_dir
            self._engine = lambda: SqliteEngine(state / "control.db")
            self._pepper, self._legacy = pepper, state / "registry.json"
        self._state = state
        self.where = self._engine().where

    def _run(self, work: Callable[[DatabaseRegistryStore], Awaitable[T]]) -> T:
        async def main() -> T:
            control = ControlStore(self._engine())
            witness = Witness(self._state / "control-witness.json", self._pepper)
            store = DatabaseRegistryStore(control, witness, origin(), self._legacy)
            try:
                return await work(store)
            except (ControlUnavailable, ControlRefused) as exc:
                raise RegistryError(str(exc)) from None
            finally:
                await control.close()

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(main())
        with ThreadPoolExecutor(1) as pool:  # called from inside an event loop: a loop of its own
            return pool.submit(asyncio.run, main()).result()

    def read(self) -> Document:
        async def read(store: DatabaseRegistryStore) -> Document:
            return await store.start() or empty_document()

        return self._run(read)

    def update(self, change: Callable[[Document], T]) -> T:
        async def update(store: DatabaseRegistryStore) -> T:
            await store.start()
            result = await store.update(change)
            await store.changed()  # this host's witness holds the new version too
            return result

        return self._run(update)
