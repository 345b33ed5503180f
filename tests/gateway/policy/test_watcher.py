"""The policy watcher survives any file content: each bad version is refused, logged and counted,
and the next good version still takes effect without a SIGHUP (a tenant removed is locked out).
`policy check` and reload refuse an audit log path that cannot be opened."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.policy.load import load_policy
from gateway.policy.node import PolicyError
from kvfence.cli import main as kvfence_main
from tests.fakes.openai_upstream import FakeUpstream
from tests.kit.gateway import ENV, Gateway, make_policy, policy_text, run_gateway
from tests.kit.polling import until
from tests.kit.probes import BAD_POLICY_CONTENT

MSG = [{"role": "user", "content": "hi"}]
BAD_CONTENT = BAD_POLICY_CONTENT


def write(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


async def reloads(gw: Gateway, result: str) -> float:
    text = await gw.metrics()
    prefix = f'kvfence_gateway_policy_reloads_total{{result="{result}"}} '
    return sum(float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix))


@pytest.fixture
async def watched(
    upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Gateway, Path]]:
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    path = tmp_path / "policy.yaml"
    write(path, policy_text(upstream.url).encode())
    gw, runner = await run_gateway(make_policy(upstream.url), upstream, reload_from=path)
    yield gw, path
    await gw.session.close()
    await runner.cleanup()


async def status_of(gw: Gateway, tenant: str) -> int:
    return (await gw.chat(tenant, {"model": "smollm2", "messages": MSG})).status


@pytest.mark.parametrize("name", sorted(BAD_CONTENT))
async def test_the_watcher_survives_any_content(
    watched: tuple[Gateway, Path],
    upstream: FakeUpstream,
    caplog: pytest.LogCaptureFixture,
    name: str,
) -> None:
    gw, path = watched
    caplog.set_level(logging.WARNING, logger="kvfence.gateway.reload")
    write(path, BAD_CONTENT[name])
    await until(lambda: reloads(gw, "refused"), what=f"{name} refused")
    assert any(r.getMessage() == "policy reload refused" for r in caplog.records)
    assert await status_of(gw, "globex") == 200  # the old policy stays in force
    # The next good version still applies, without a SIGHUP: globex is removed.
    text = policy_text(upstream.url)
    start = text.index("  - {id: globex")
    write(path, (text[:start] + text[text.index("  - {id: initech") :]).encode())
    await until(lambda: reloads(gw, "ok"), what="the good policy loaded after the bad one")
    assert await status_of(gw, "globex") == 401
    assert await status_of(gw, "acme") == 200
    assert await reloads(gw, "refused") == 1


@pytest.mark.parametrize("name", sorted(BAD_CONTENT))
def test_policy_check_reports_every_content_as_an_error(tmp_path: Path, name: str) -> None:
    path = tmp_path / "policy.yaml"
    path.write_bytes(BAD_CONTENT[name])
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert info.value.errors and all(e.startswith(f"{path}:") for e in info.value.errors)


def audit_policy(tmp_path: Path, where: str) -> Path:
    (tmp_path / "audit.key").write_text("k" * 32)
    audit = f"access_log: false\n  audit_log: {{path: {where}, key: {{file: audit.key}}}}"
    path = tmp_path / "p.yaml"
    path.write_text(policy_text("http://127.0.0.1:9").replace("access_log: false", audit))
    return path


@pytest.mark.parametrize(
    ("where", "why"),
    [
        ("missing/audit.jsonl", "does not exist"),
        ("file/audit.jsonl", "does not exist"),
        ("folder", "not a file"),
    ],
)
def test_policy_check_refuses_an_audit_path_that_cannot_be_opened(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    where: str,
    why: str,
) -> None:
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    (tmp_path / "file").write_text("not a folder")
    (tmp_path / "folder").mkdir()
    path = audit_policy(tmp_path, where)
    assert kvfence_main(["policy", "check", str(path)]) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert "audit_log.path" in line and why in line and str(tmp_path) in line
    (tmp_path / "ok").mkdir()
    assert kvfence_main(["policy", "check", str(audit_policy(tmp_path, "ok/audit.jsonl"))]) == 0


async def test_reload_refuses_an_audit_path_that_cannot_be_opened(
    watched: tuple[Gateway, Path], upstream: FakeUpstream, tmp_path: Path
) -> None:
    gw, path = watched
    (tmp_path / "audit.key").write_text("k" * 32)
    audit = "access_log: false\n  audit_log: {path: gone/audit.jsonl, key: {file: audit.key}}"
    write(path, policy_text(upstream.url).replace("access_log: false", audit).encode())
    await until(lambda: reloads(gw, "refused"), what="the reload refused")
    assert await status_of(gw, "acme") == 200  # served under the old policy, not failed


async def test_the_watcher_follows_every_file_the_policy_reads(
    watched: tuple[Gateway, Path],
    upstream: FakeUpstream,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The natural order: name a new tenant's digest file in the policy (refused: it does not
    exist yet), then mint its key into that file; the watcher reloads on the file's creation,
    and again on the next key appended to it, with no SIGHUP and no `admin reload`."""
    gw, path = watched
    newcomer = (
        "  - {id: hooli, api_keys: [{file: hooli.digests}], scope: tenant, models: [smollm2]}\n"
    )
    write(path, (policy_text(upstream.url) + newcomer).encode())
    await until(lambda: reloads(gw, "refused"), what="the policy naming a missing file refused")
    keys = tmp_path / "hooli.digests"
    mint = ["keys", "new", "--tenant", "hooli", "--policy", str(path), "--digest-file", str(keys)]
    assert kvfence_main([*mint, "--json"]) == 0
    key = json.loads(capsys.readouterr().out)["api_key"]
    await until(lambda: reloads(gw, "ok"), what="the reload on the digest file's creation")
    headers = {"authorization": f"Bearer {key}"}
    body = {"model": "smollm2", "messages": MSG}
    resp = await gw.session.post(gw.url + "/v1/chat/completions", json=body, headers=headers)
    assert resp.status == 200
    assert kvfence_main([*mint, "--json"]) == 0  # a second key appended to the same file
    second = json.loads(capsys.readouterr().out)["api_key"]
    headers = {"authorization": f"Bearer {second}"}

    async def served() -> bool:
        url = gw.url + "/v1/chat/completions"
        return (await gw.session.post(url, json=body, headers=headers)).status == 200

    await until(served, what="the second key served after its digest was appended")
