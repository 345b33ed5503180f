"""`kvfence admin` as an operator runs it: `--policy` finds the admin listener and its token
(even when the policy now on disk would not load, so a refused reload can be asked about), a
refused reload prints one line per error, and without `--policy` an unreachable default says
how to point it elsewhere."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import pytest

from gateway import admin_cli
from gateway.policy.load import load_policy
from gateway.server import start_admin
from kvfence.cli import main as kvfence_main
from tests.fakes.openai_upstream import FakeUpstream
from tests.kit.gateway import ENV, policy_text, run_gateway

TOKEN = "admin-token-0123456789abcdef"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_admin_with_the_policy_and_a_refused_reload(
    upstream: FakeUpstream,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    (tmp_path / "admin-token").write_text(TOKEN)
    port = _free_port()
    good = policy_text(upstream.url).replace(
        "admin: {host: 127.0.0.1, port: 0}",
        f"admin: {{host: 127.0.0.1, port: {port}, token: {{file: admin-token}}}}",
    )
    path = tmp_path / "policy.yaml"
    path.write_text(good)
    gw, runner = await run_gateway(load_policy(path), upstream, reload_from=path)
    admin = await start_admin(gw.app, "127.0.0.1", port)
    try:
        code = await asyncio.to_thread(kvfence_main, ["admin", "--policy", str(path), "status"])
        assert code == 0 and json.loads(capsys.readouterr().out)["ready"] in (True, False)

        # Two mistakes: the reload is refused, and each is a line of its own.
        bad = good.replace("scope: tenant", "scope: team", 1).replace("scope: user", "scope: x")
        path.write_text(bad)
        code = await asyncio.to_thread(kvfence_main, ["admin", "--policy", str(path), "reload"])
        lines = capsys.readouterr().err.splitlines()
        assert code == 1
        assert lines[0].startswith("kvfence admin: 422 policy_invalid: policy reload refused")
        assert len(lines) == 3 and all(str(path) in line for line in lines[1:])
        assert "tenants[0].scope" in lines[1] and "tenants[2].scope" in lines[2]
    finally:
        await admin.cleanup()
        await gw.session.close()
        await runner.cleanup()


def test_an_unreachable_default_says_how_to_point_elsewhere(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KVFENCE_ADMIN_TOKEN", raising=False)
    monkeypatch.setattr(admin_cli, "DEFAULT_URL", f"http://127.0.0.1:{_free_port()}")
    assert kvfence_main(["admin", "status"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("kvfence admin: cannot reach http://127.0.0.1:")
    assert line.endswith("(a gateway on other ports: --policy FILE, or --url)")
