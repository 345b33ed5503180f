"""What a person and a CI job read: the summary names n per arm, p-value, medians, effect and
what was spent; the JSON report holds the same and every measurement, and no secret."""

from __future__ import annotations

import io
import random
from typing import Any

import orjson

from kvfence.probe.client import Endpoint, Identity
from kvfence.probe.method import ProbeConfig, run_probe
from kvfence.probe.progress import ProgressBar
from kvfence.probe.prompts import PromptFactory
from kvfence.probe.report import summary, to_json
from kvfence.probe.rounds import Phase
from tests.kvfence.probe.sim import SimEndpoint, pooled

KEY = "sk-secret-key-000111222"
A = Identity("A", key=KEY, headers=(("X-End-User", "alice-secret"),))
B = Identity("B", body=(("cache_salt", "salt-secret"),))
ENDPOINT = Endpoint("https://user:pw@llm.example/v1?token=t0k", "m")
CONFIG = ProbeConfig(letters=96, partial_letters=32, budget=40, use_metadata=False)


async def timing_only_shared() -> tuple[str, dict[str, Any]]:
    sim = SimEndpoint(scope=pooled)
    prompts = PromptFactory(96, random.Random(3))
    result = await run_probe(sim, A, B, CONFIG, rng=random.Random(3), prompts=prompts)
    return summary(result, ENDPOINT), to_json(result, ENDPOINT, A, B)


async def test_summary_states_n_p_medians_effect_and_cost() -> None:
    text, doc = await timing_only_shared()
    cross = doc["cross"]["timing"]
    n = cross["hit"]["n"]
    assert text.splitlines()[0] == "kvfence probe  https://llm.example/v1  model m"
    assert "verdict: SHARED (exit 1)" in text
    assert f"n = {n}/{n}" in text and f"n={n}: p=" in text
    assert f"hit median {round(cross['hit']['median_ms'])} ms" in text
    assert "miss - hit +" in text and "AUC" in text
    assert f"spent: {doc['spent']['requests']} requests" in text


async def test_json_report_has_every_measurement_and_no_secret() -> None:
    _, doc = await timing_only_shared()
    raw = orjson.dumps(doc).decode()
    for secret in (KEY, "alice-secret", "salt-secret", "pw", "t0k"):
        assert secret not in raw
    assert doc["endpoint"] == {"url": "https://llm.example/v1", "model": "m", "api": "chat"}
    measurements = doc["measurements"]
    assert isinstance(measurements, list)
    assert doc["spent"]["requests"] == sum(
        1 if m["phase"] == Phase.WARMUP else 2 for m in measurements
    )
    assert doc["settings"]["test"] == "rank-sum"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_redraws_on_a_terminal_and_prints_lines_elsewhere() -> None:
    tty, log = Terminal(), io.StringIO()
    for stream in (tty, log):
        bar = ProgressBar(stream, every=5)
        for done in range(1, 11):
            bar(Phase.CROSS, done, 10)
    assert tty.getvalue().count("\r") == 10 and tty.getvalue().endswith("10/10 rounds\n")
    assert log.getvalue().splitlines() == ["probe: cross 5/10 rounds", "probe: cross 10/10 rounds"]
