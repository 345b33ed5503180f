"""Metrics of a real `kvfence gateway --workers 2`: every scrape of the admin `/metrics` reports
the sum over both workers (never one worker's share), per tenant and model, and every metric
the Grafana dashboard in docs/grafana queries is there."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from tests.fakes.openai_upstream import FakeUpstream
from tests.gateway.test_cli import _free_port
from tests.kit.gateway import ENV, KEYS, policy_text

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "grafana" / "kvfence-gateway.json"
AUTH_FAILURES = 20
SCRAPES = 8


def _queries(node: object) -> list[str]:
    """Every PromQL expression and variable query in a dashboard."""
    if isinstance(node, dict):
        found = [v for k, v in node.items() if k in ("expr", "definition") and isinstance(v, str)]
        return found + [q for v in node.values() for q in _queries(v)]
    if isinstance(node, list):
        return [q for v in node for q in _queries(v)]
    return []


def _metric(text: str, sample: str) -> float:
    match = re.search(rf"^{re.escape(sample)} (\S+)$", text, re.M)
    assert match, f"{sample} not in the scrape"
    return float(match.group(1))


class Running:
    def __init__(self, url: str, admin: str, state: Path) -> None:
        self.url, self.admin, self.state = url, admin, state

    async def get(self, url: str, **kwargs: object) -> tuple[int, str]:
        # A connection per request: SO_REUSEPORT spreads connections over the workers.
        connector = aiohttp.TCPConnector(force_close=True)
        async with (
            aiohttp.ClientSession(connector=connector) as http,
            http.request(str(kwargs.pop("method", "GET")), url, **kwargs) as resp,  # type: ignore[arg-type]
        ):
            return resp.status, await resp.text()


@pytest.fixture
async def gateway(tmp_path: Path, upstream: FakeUpstream) -> AsyncIterator[Running]:
    port, admin = _free_port(), _free_port()
    text = policy_text(upstream.url).replace("access_log: false", f"state_dir: {tmp_path}/state")
    (tmp_path / "p.yaml").write_text(text)
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "kvfence.cli", "gateway", "--policy", str(tmp_path / "p.yaml")),
        *("--port", str(port), "--admin-port", str(admin), "--workers", "2"),
        env={**os.environ, **ENV},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    seen: list[bytes] = []
    try:
        async with asyncio.timeout(60):
            while sum(b'"msg":"serving"' in line for line in seen) < 2:
                line = await proc.stderr.readline()
                assert line, b"".join(seen).decode()
                seen.append(line)
        yield Running(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin}", tmp_path / "state")
    finally:
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            assert await proc.wait() == 0


def _per_worker(folder: Path, tmp: Path) -> list[float]:
    """Auth failures each worker counted, read from its own file alone."""
    counts = []
    for index, db in enumerate(sorted(folder.glob("counter_*.db"))):
        alone = tmp / f"worker{index}"
        alone.mkdir()
        shutil.copy(db, alone)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(alone))
        text = generate_latest(registry).decode()
        found = re.search(
            r'^kvfence_gateway_auth_failures_total\{reason="missing"\} (\S+)$', text, re.M
        )
        counts.append(float(found.group(1)) if found else 0.0)
    return counts


async def test_every_scrape_reports_the_sum_of_both_workers(
    gateway: Running, tmp_path: Path
) -> None:
    chat = gateway.url + "/v1/chat/completions"
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}
    for _ in range(AUTH_FAILURES):
        assert (await gateway.get(chat, method="POST", json=body))[0] == 401
    auth = {"authorization": f"Bearer {KEYS['acme']}"}
    for stream in (False, True, True):
        status, _ = await gateway.get(
            chat, method="POST", json={**body, "stream": stream}, headers=auth
        )
        assert status == 200
    # Both workers answered some of the refused requests...
    shares = _per_worker(gateway.state / "metrics", tmp_path)
    assert sum(shares) == AUTH_FAILURES and sorted(shares)[-2] > 0, shares
    # ...and whichever worker answers a scrape reports the whole.
    for _ in range(SCRAPES):
        status, text = await gateway.get(gateway.admin + "/metrics")
        assert status == 200
        assert (
            _metric(text, 'kvfence_gateway_auth_failures_total{reason="missing"}') == AUTH_FAILURES
        )
        labels = '{model="smollm2",tenant="acme"}'
        assert _metric(text, f"kvfence_gateway_prompt_tokens_total{labels}") == 36
        assert _metric(text, f"kvfence_gateway_completion_tokens_total{labels}") == 9
        assert _metric(text, f"kvfence_gateway_cached_tokens_total{labels}") == 21
        assert _metric(text, f"kvfence_gateway_time_to_first_token_seconds_count{labels}") == 2
        assert _metric(text, f"kvfence_gateway_in_flight{labels}") == 0
        assert _metric(text, 'kvfence_gateway_backend_up{backend="fake-vllm"}') == 1
    # Every metric the dashboard queries is exported.
    exported = set(re.findall(r"^(kvfence_\w+?)(?:\{| )", text, re.M))
    queried = {name for q in _queries(json.loads(DASHBOARD.read_text())) for name in
               re.findall(r"\bkvfence_\w+", q)}  # fmt: skip
    assert queried, "the dashboard queries nothing"
    assert queried <= exported, sorted(queried - exported)


def test_the_dashboard_covers_what_an_operator_asks() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    titles = " | ".join(p["title"].lower() for p in panels)
    for topic in ("requests", "error", "verdict", "cache hit", "spend", "first token",
                  "in flight", "quarantine", "canary", "backend up"):  # fmt: skip
        assert topic in titles, topic
    for panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}"
        assert panel["targets"] and all(t["expr"] for t in panel["targets"])
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
