"""Opening the control-plane database for one gateway app (each worker its own connection or
pool): SQLite under the state directory unless the policy names PostgreSQL; its schema is
migrated before the first request, and it is closed after every task that uses it.

Invariant: the app never serves before the migrations ran (or the database was refused), and
the database is chosen once, at start (`gateway.control` changes with a restart).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web

from gateway.control.engine import ControlUnavailable, Engine
from gateway.control.sqlite import SqliteEngine
from gateway.control.store import ControlStore
from gateway.policy.model import ControlDatabase, Policy

CONTROL = web.AppKey("kvfence_control", ControlStore)


def engine_for(policy: Policy, state_dir: Path) -> Engine:
    control = policy.gateway.control
    if control.database is ControlDatabase.POSTGRESQL:
        from gateway.control.postgres import PostgresEngine  # the `postgres` extra

        assert control.password is not None  # the reader requires it
        return PostgresEngine(control.url, control.password.value.decode(), control.timeout_s)
    return SqliteEngine(control.path or state_dir / "control.db")


def missing_support(policy: Policy) -> str | None:
    """One line naming the extra to install when the policy asks for PostgreSQL without it."""
    if policy.gateway.control.database is not ControlDatabase.POSTGRESQL:
        return None
    import importlib.util

    if importlib.util.find_spec("asyncpg") is not None:
        return None
    return (
        "the policy sets gateway.control database: postgresql, which needs its driver: "
        "pip install 'kvfence[gateway,postgres]'"
    )


def origin() -> str:
    """Who wrote a row: this host and process (for an operator reading the tables)."""
    return f"{os.uname().nodename}/{os.getpid()}"


def open_control(app: web.Application, policy: Policy, state_dir: Path) -> ControlStore:
    store = app[CONTROL] = ControlStore(engine_for(policy, state_dir))
    app.cleanup_ctx.append(_control_ctx)
    return store


async def _control_ctx(app: web.Application) -> AsyncIterator[None]:
    store = app[CONTROL]
    with contextlib.suppress(ControlUnavailable):  # retried by every later use
        await store.migrate()
    yield
    await store.close()
