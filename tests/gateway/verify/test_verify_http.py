"""Verification over real HTTP with fake servers that cache: a canary marker leaked into another
tenant's answer is caught (plain and streamed), a sharing backend is quarantined and its model
fails over, workers agree through the shared state, and the admin listener is the only way in."""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from gateway.app import create_app
from gateway.fleet.local_health import Health
from gateway.policy.load import parse_policy
from gateway.server import bound_port, start, start_admin
from gateway.verify.service import VERIFY
from gateway.verify.watch import WATCH
from kvfence.cli import main as kvfence_main
from tests.fakes.cache_server import CacheServer
from tests.kit.gateway import ENV, KEYS, digest
from tests.kit.polling import until
from tests.kit.verified_gateway import policy_text, verified_gateway

TOKEN = "admin-token-0123456789abcdef"
CANARY = "{canary: {interval_s: 3600, prompt_tokens: 64}}"


def policy(servers: list[str], state_dir: Path, *, token: bool = True, audit: bool = False) -> str:
    backends = "".join(
        f"""
  - name: b{i}
    kind: vllm
    url: {url}
    verify: {CANARY}
    models: [{{name: smollm2, revision: "1"}}]"""
        for i, url in enumerate(servers)
    )
    admin = "{host: 127.0.0.1, port: 0, token: {env: ADMIN}}" if token else "{port: 0}"
    audit_log = f"\n          audit_log: {{path: {state_dir}/audit.jsonl, key: {{env: ADMIN}}}}"
    audit_log = audit_log if audit else ""
    return (
        textwrap.dedent(f"""\
        version: 1
        gateway:
          namespace_keys: [{{id: ns1, secret: {{env: NS_KEY}}, active: true}}]
          api_key_pepper: {{env: PEPPER}}
          admin: {admin}
          state_dir: {state_dir}
          access_log: false{audit_log}
        backends:""")
        + backends
        + textwrap.dedent(f"""
        tenants:
          - {{id: acme, api_keys: ["{digest("acme")}"], scope: tenant, models: [smollm2]}}
          - {{id: globex, api_keys: ["{digest("globex")}"], scope: tenant, models: [smollm2]}}
        """)
    )


class Gw:
    def __init__(self, app: web.Application, url: str, admin: str, http: aiohttp.ClientSession):
        self.app, self.url, self.admin_url, self.http = app, url, admin, http

    def health(self, name: str = "b0") -> Health:
        return self.app[VERIFY].health.get(name)

    async def chat(self, tenant: str, text: str, stream: bool = False) -> aiohttp.ClientResponse:
        body: dict[str, Any] = {"model": "smollm2", "stream": stream,
                                "messages": [{"role": "user", "content": text}]}  # fmt: skip
        headers = {"authorization": f"Bearer {KEYS[tenant]}"}
        return await self.http.post(self.url + "/v1/chat/completions", json=body, headers=headers)

    async def admin(self, method: str, path: str, token: str | None = TOKEN) -> int:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        async with self.http.request(method, self.admin_url + path, headers=headers) as resp:
            return resp.status


@asynccontextmanager
async def gateway(text: str, state_dir: Path | None = None) -> AsyncIterator[Gw]:
    app = create_app(parse_policy(text, "v.yaml", env={**ENV, "ADMIN": TOKEN}), state_dir=state_dir)
    runner = await start(app, "127.0.0.1", 0)
    admin = await start_admin(app, "127.0.0.1", 0)
    async with aiohttp.ClientSession() as http:
        try:
            yield Gw(
                app,
                f"http://127.0.0.1:{bound_port(runner)}",
                f"http://127.0.0.1:{bound_port(admin)}",
                http,
            )
        finally:
            await admin.cleanup()
            await runner.cleanup()


@asynccontextmanager
async def servers(*kinds: dict[str, Any]) -> AsyncIterator[list[CacheServer]]:
    started = [CacheServer(**kind) for kind in kinds]
    for server in started:
        await server.start()
    try:
        yield started
    finally:
        for server in started:
            await server.close()


async def rounds_done(gw: Gw, *names: str) -> None:
    await until(lambda: all(gw.health(n).rounds for n in names), what="the first canary rounds")


async def test_a_leaked_marker_is_caught_in_a_plain_and_a_streamed_answer(tmp_path: Path) -> None:
    async with (
        servers({"leak_markers": True}) as [fake],
        gateway(policy([fake.url], tmp_path)) as gw,
    ):
        await rounds_done(gw, "b0")
        assert gw.health().canary == "isolated"  # the counters say nothing is shared
        resp = await gw.chat("acme", "hello")
        body = await resp.text()
        assert resp.status == 502 and "kvfc" not in body
        assert resp.headers["x-kvfence-verdict"] == "violation"
        assert gw.health().quarantined and gw.health().violations == {"marker": 1}
        assert await gw.admin("POST", "/quarantine/b0/release") == 200
        stream = await gw.chat("globex", "hello again", stream=True)
        raw = await stream.read()
        assert stream.status == 200  # headers went out before the marker arrived
        assert b"event: error" in raw and b"[DONE]" not in raw
        delivered = "".join(
            orjson.loads(event[6:])["choices"][0]["delta"]["content"]
            for event in raw.split(b"\n\n")
            if event.startswith(b"data: {") and b'"content"' in event
        )
        assert delivered.startswith("I remember") and "kvfc" not in delivered
        assert gw.health().quarantined


async def test_a_sharing_backend_is_quarantined_and_its_model_fails_over(tmp_path: Path) -> None:
    async with (
        servers({"honours_salt": False}, {}) as [sharing, honest],
        gateway(policy([sharing.url, honest.url], tmp_path)) as gw,
    ):
        await rounds_done(gw, "b0", "b1")
        assert gw.health("b0").quarantined and gw.health("b0").canary == "shared"
        assert not gw.health("b1").quarantined and gw.health("b1").canary == "isolated"
        before = len(sharing.served)
        for tenant in ("acme", "globex", "acme"):
            resp = await gw.chat(tenant, "route me")
            assert resp.status == 200 and resp.headers["x-kvfence-verdict"] == "verified"
        assert len(sharing.served) == before  # tenant traffic never reached the sharing one


async def test_workers_agree_on_a_quarantine_through_the_state_dir(tmp_path: Path) -> None:
    async with servers({}) as [fake]:
        text = policy([fake.url], tmp_path)
        async with gateway(text, tmp_path) as one, gateway(text, tmp_path) as two:
            await rounds_done(one, "b0")
            assert (await two.chat("acme", "hi")).status == 200
            await one.app[VERIFY].health.update("b0", lambda h: Health(quarantined=True))
            await until(lambda: two.health().quarantined, what="the other worker's view")
            assert (await two.chat("acme", "hi")).status == 503


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "DELETE"])
async def test_operational_paths_are_not_on_the_tenant_port(tmp_path: Path, method: str) -> None:
    async with servers({}) as [fake], gateway(policy([fake.url], tmp_path)) as gw:
        for path in ("/status", "/metrics", "/canary/b0", "/quarantine/b0/release"):
            headers = {"authorization": f"Bearer {KEYS['acme']}"}
            async with gw.http.request(method, gw.url + path, headers=headers) as resp:
                assert resp.status in (404, 405), (method, path)  # 405: PUT, DELETE at the edge


async def test_the_admin_listener_needs_its_token_not_a_tenant_key(tmp_path: Path) -> None:
    async with servers({}) as [fake], gateway(policy([fake.url], tmp_path)) as gw:
        assert await gw.admin("GET", "/status", token=KEYS["acme"]) == 401
        assert await gw.admin("POST", "/quarantine/b0/release", token=KEYS["acme"]) == 401
        assert await gw.admin("GET", "/status") == 200
        assert await gw.admin("GET", "/metrics") == 200
        assert await gw.admin("POST", "/canary/b0") == 200
        assert await gw.admin("POST", "/canary/nope") == 404
    async with servers({}) as [fake], gateway(policy([fake.url], tmp_path, token=False)) as gw:
        assert await gw.admin("GET", "/status", token=None) == 200  # loopback, read-only
        assert await gw.admin("POST", "/quarantine/b0/release", token=None) == 403


async def test_the_admin_cli_releases_a_quarantine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async with (
        servers({"honours_salt": False}) as [fake],
        gateway(policy([fake.url], tmp_path)) as gw,
    ):
        await rounds_done(gw, "b0")
        assert gw.health().quarantined
        base = ["admin", "--url", gw.admin_url, "--token-env", "GW_ADMIN"]
        monkeypatch.setenv("GW_ADMIN", "wrong-token-0123456789")
        assert await asyncio.to_thread(kvfence_main, [*base, "release", "b0"]) == 1
        monkeypatch.setenv("GW_ADMIN", TOKEN)
        assert await asyncio.to_thread(kvfence_main, [*base, "status"]) == 0
        assert '"quarantined": true' in capsys.readouterr().out
        assert await asyncio.to_thread(kvfence_main, [*base, "release", "b0"]) == 0
        assert not gw.health().quarantined
        assert TOKEN not in capsys.readouterr().out


async def test_transitions_are_audit_logged_and_shown_in_metrics(tmp_path: Path) -> None:
    async with (
        servers({"honours_salt": False}) as [fake],
        gateway(policy([fake.url], tmp_path, audit=True)) as gw,
    ):
        await rounds_done(gw, "b0")
        assert await gw.admin("POST", "/quarantine/b0/release") == 200
        async with gw.http.get(
            gw.admin_url + "/metrics", headers={"authorization": f"Bearer {TOKEN}"}
        ) as resp:
            metrics = await resp.text()
    rows = [orjson.loads(line) for line in (tmp_path / "audit.jsonl").read_bytes().splitlines()]
    events = [(r["event"], r["backend"]) for r in rows if "event" in r]
    assert events == [("quarantine", "b0"), ("release", "b0")]
    assert 'kvfence_gateway_backend_quarantined{backend="b0"} 0.0' in metrics
    assert 'kvfence_gateway_backend_canary_outcome{backend="b0",outcome="shared"} 1.0' in metrics
    assert 'kvfence_gateway_quarantine_transitions_total{backend="b0",event="quarantine"} 1.0' in (
        metrics
    )
    assert 'kvfence_gateway_backend_violations{backend="b0",kind="canary"} 1.0' in metrics


async def test_status_and_metrics_say_what_rounds_covered_and_why(tmp_path: Path) -> None:
    fake = CacheServer()
    await fake.start()
    text = policy_text(
        fake.url, tmp_path, canary="{interval_s: 3600, prompt_tokens: 64}",
        detective="{block_size: 16}",
    )  # fmt: skip
    try:
        async with verified_gateway(text) as gw:
            await until(lambda: gw.health().rounds >= 1, what="the first canary round")
            ids = list(range(100, 300))
            for prompt in (" ".join(map(str, ids)), ids):  # the same tokens: text, then ids
                body = {"model": "smollm2", "prompt": prompt, "max_tokens": 2}
                resp = await gw.post("acme", "/v1/completions", body)
                await resp.read()
            assert resp.headers["x-kvfence-verdict"] == "unexplained"  # no tokenizer: bound
            await gw.app[WATCH].idle()  # the round it triggered, shaped like it
            _, body = await gw.admin("GET", "/status")
            headers = {"authorization": f"Bearer {TOKEN}"}
            metrics = await (
                await gw.session.get(gw.admin_url + "/metrics", headers=headers)
            ).text()
    finally:
        await fake.close()
    backend = body["backends"]["upstream"]
    assert backend["triggered"] == 1 and backend["canary"] == "isolated"
    assert backend["canary_shapes"] == ["chat/stream/1m/64t", "completions/plain/1m/256t"]
    assert backend["verdict_reasons"] == {"unexplained:nobody": 1}
    assert backend["canary_id"] and backend["counter"] == "honest"
    assert body["history"]["tenants"]["acme"]["records"] > 0
    for line in (
        'canary_triggered_total{backend="upstream",finding="nobody",result="run"} 1.0',
        'canary_shape_rounds_total{backend="upstream",path="completions",stream="plain"} 1.0',
        'verdict_reasons_total{backend="upstream",reason="nobody",verdict="unexplained"} 1.0',
        'canary_requests_total{backend="upstream",trigger="tenant"} 3.0',
    ):
        assert "kvfence_gateway_" + line in metrics, line
