"""The embedded control database (SQLite in `state_dir`, the default for one gateway): two
workers share it; a revocation outlives a restart, and a database file restored from a backup
taken before it serves the revoked key on no worker (the state directory's witness knows
better, writes it back and counts it); the schema is versioned and a newer one is refused."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from pathlib import Path

import aiohttp
import pytest

from gateway.control.engine import ControlRefused
from gateway.control.sqlite import SqliteEngine
from gateway.control.store import ControlStore
from gateway.policy.load import parse_policy
from tests.fakes.openai_upstream import FakeUpstream
from tests.gateway.control.test_fleet_registry import TOKEN, admin_of, call, post
from tests.kit.gateway import ENV, Gateway, policy_text, run_gateway


def embedded_text(upstream: FakeUpstream, state: Path) -> str:
    text = policy_text(upstream.url).replace(
        "  admin: {host: 127.0.0.1, port: 0}\n",
        f"  admin: {{host: 127.0.0.1, port: 0, token: {{env: ADMIN}}}}\n  state_dir: {state}\n",
    )
    return text + "registry: true\n"


def backup(db: Path, to: Path) -> None:
    """An online backup of the database file (what an operator's backup job takes)."""
    with (
        contextlib.closing(sqlite3.connect(db)) as src,
        contextlib.closing(sqlite3.connect(to)) as dst,
    ):
        src.backup(dst)


async def test_a_restored_database_file_serves_no_revoked_key(tmp_path: Path) -> None:
    upstream = FakeUpstream()
    await upstream.start()
    state = tmp_path / "state"
    state.mkdir()
    started = []
    policy = parse_policy(embedded_text(upstream, state), "p.yaml", env={**ENV, "ADMIN": TOKEN})

    async def workers() -> list[tuple[Gateway, aiohttp.web.AppRunner]]:
        return [await run_gateway(policy, upstream, state_dir=state) for _ in range(2)]

    try:
        started = await workers()
        (one, _), (two, _) = started
        async with admin_of(one) as (http, admin):
            await post(http, admin + "/tenants", {"id": "team9"})
            _, doomed = await post(http, admin + "/keys", {"tenant": "team9"})
            backup(state / "control.db", tmp_path / "before.db")
            assert (await post(http, admin + f"/keys/{doomed['id']}/revoke"))[0] == 200
        for gw in (one, two):
            for _ in range(40):  # the other worker follows within a second
                if await call(gw, doomed["key"]) == 401:
                    break
                await asyncio.sleep(0.05)
            assert await call(gw, doomed["key"]) == 401
        for gw, runner in started:
            await gw.session.close()
            await runner.cleanup()

        for suffix in ("-wal", "-shm"):
            (state / f"control.db{suffix}").unlink(missing_ok=True)
        (tmp_path / "before.db").replace(state / "control.db")  # the restore
        started = await workers()
        for gw, _ in started:
            assert await call(gw, doomed["key"]) == 401
        metrics = await started[0][0].metrics() + await started[1][0].metrics()
        assert "kvfence_gateway_control_rollbacks_total 1.0" in metrics
    finally:
        for gw, runner in started:
            await gw.session.close()
            await runner.cleanup()
        await upstream.close()


async def test_a_schema_newer_than_the_gateway_is_refused(tmp_path: Path) -> None:
    store = ControlStore(SqliteEngine(tmp_path / "control.db"))
    await store.migrate()
    async with store.engine.transaction() as tx:
        await tx.execute("INSERT INTO kvfence_migrations (number, applied) VALUES (99, 0)")
    again = ControlStore(SqliteEngine(tmp_path / "control.db"))
    with pytest.raises(ControlRefused, match="has schema 99, newer than this gateway's 2"):
        await again.migrate()
    await store.close()
    await again.close()
