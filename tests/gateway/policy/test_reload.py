"""Policy reload: a valid file swaps in whole; an invalid one is refused and counted."""

import os
import signal
from pathlib import Path

from gateway.policy.load import parse_policy
from gateway.server import bound_port, start_admin
from tests.fakes.openai_upstream import FakeUpstream
from tests.kit.gateway import ENV, Gateway, make_policy, policy_text, run_gateway
from tests.kit.polling import until

MSG = [{"role": "user", "content": "hi"}]


async def _salt(gw: Gateway) -> str:
    resp = await gw.chat("acme", {"model": "smollm2", "messages": MSG})
    assert resp.status == 200
    return str(gw.upstream.received[-1].json["cache_salt"])


async def _metric(gw: Gateway, line: str) -> bool:
    return line in await gw.metrics()


def _write(path: Path, text: str) -> None:
    """Replace the file atomically, as a deploy tool does (an editor's partial write would be
    refused once and then picked up; that is correct but makes counts noisy)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


async def test_reload_on_change_and_refusal(
    upstream: FakeUpstream, tmp_path: Path, monkeypatch: object
) -> None:
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)  # type: ignore[attr-defined]
    path = tmp_path / "policy.yaml"
    _write(path, policy_text(upstream.url))
    gw, runner = await run_gateway(make_policy(upstream.url), upstream, reload_from=path)
    try:
        before = await _salt(gw)
        assert before.startswith("ns1.")
        _write(path, policy_text(upstream.url, active="ns2"))  # key rotation
        await until(lambda: _metric(gw, 'kvfence_gateway_policy_reloads_total{result="ok"} 1.0'))
        assert (await _salt(gw)).startswith("ns2.")

        _write(path, policy_text(upstream.url).replace("scope: tenant", "scope: team"))
        await until(
            lambda: _metric(gw, 'kvfence_gateway_policy_reloads_total{result="refused"} 1.0')
        )
        assert (await _salt(gw)).startswith("ns2.")  # the old policy stays

        _write(path, policy_text(upstream.url, active="ns1"))
        await until(lambda: _metric(gw, 'kvfence_gateway_policy_reloads_total{result="ok"} 2.0'))
        assert await _salt(gw) == before

        os.kill(os.getpid(), signal.SIGHUP)  # the file is unchanged: only the signal reloads
        await until(lambda: _metric(gw, 'kvfence_gateway_policy_reloads_total{result="ok"} 3.0'))
    finally:
        await gw.session.close()
        await runner.cleanup()


async def test_admin_reload_answers_with_the_outcome(
    upstream: FakeUpstream, tmp_path: Path, monkeypatch: object
) -> None:
    """POST /reload on the admin listener: 200 with the new policy's summary, 422 naming every
    error (the running policy stays), the admin token required, absent on the tenant port."""
    env = {**ENV, "ADMIN": "admin-token-0123456789abcdef"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)  # type: ignore[attr-defined]
    admin_line = "admin: {{host: 127.0.0.1, port: 0, token: {{env: ADMIN}}}}"

    def text(**kw: str) -> str:
        return policy_text(upstream.url, **kw).replace(
            "admin: {host: 127.0.0.1, port: 0}", admin_line.format()
        )

    path = tmp_path / "policy.yaml"
    _write(path, text())
    assert "token: {env: ADMIN}" in path.read_text()
    gw, runner = await run_gateway(parse_policy(text(), "p.yaml", env=env), upstream,
                                   reload_from=path)  # fmt: skip
    admin = await start_admin(gw.app, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{bound_port(admin)}/reload"
    auth = {"authorization": f"Bearer {env['ADMIN']}"}
    try:
        assert (await gw.session.post(url)).status == 401
        assert (await gw.session.post(gw.url + "/reload", headers=auth)).status in (404, 405)

        _write(path, text().replace("scope: tenant", "scope: team"))
        resp = await gw.session.post(url, headers=auth)
        body = await resp.json()
        assert resp.status == 422 and body["error"]["code"] == "policy_invalid"
        assert any("scope" in line for line in body["error"]["errors"])
        assert (await _salt(gw)).startswith("ns1.")  # the old policy stays

        _write(path, text(active="ns2"))
        resp = await gw.session.post(url, headers=auth)
        assert resp.status == 200 and (await resp.json())["reloaded"] is True
        assert (await _salt(gw)).startswith("ns2.")
    finally:
        await admin.cleanup()
        await gw.session.close()
        await runner.cleanup()
