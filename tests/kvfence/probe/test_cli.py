"""`kvfence probe` as a CI job runs it: a subprocess against an HTTP endpoint (the simulated
cache served on port 0), judged by its exit code, summary, JSON report and plot; a key never
appears in any of them, and a probe that cannot run says why in one line."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from tests.kvfence.probe.sim import SimCache, SimServer

KEY_A, KEY_B = "sk-alpha-0123456789", "sk-beta-9876543210"


def fast_cache() -> SimCache:
    """Milliseconds per request, so a whole probe runs in seconds."""
    return SimCache(base_s=0.005, per_token_s=0.0003, noise_s=0.002)


@dataclass
class Run:
    code: int
    out: str
    err: str


async def kvfence(*args: str, env: dict[str, str] | None = None) -> Run:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kvfence.cli",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode is not None
    return Run(proc.returncode, out.decode(), err.decode())


def probe_args(url: str, tmp: Path, *extra: str) -> list[str]:
    (tmp / "key-b").write_text(KEY_B + "\n")
    return [
        "probe",
        "--base-url",
        url,
        "--model",
        "sim",
        "--key-a-env",
        "PROBE_KEY_A",
        "--key-b-file",
        str(tmp / "key-b"),
        "--prompt-tokens",
        "64",
        "--partial-tokens",
        "24",
        *extra,
    ]


@pytest.fixture
async def pooled() -> AsyncIterator[SimServer]:
    async with SimServer(fast_cache(), pooled=True) as server:
        yield server


@pytest.fixture
async def separate() -> AsyncIterator[SimServer]:
    async with SimServer(fast_cache()) as server:
        yield server


async def test_shared_exits_1_with_summary_report_and_plot(
    pooled: SimServer, tmp_path: Path
) -> None:
    report, plot = tmp_path / "probe.json", tmp_path / "probe.png"
    args = probe_args(pooled.url, tmp_path, "--report", str(report), "--plot", str(plot))
    run = await kvfence(*args, env={"PROBE_KEY_A": KEY_A})
    assert run.code == 1, run.err
    assert "verdict: SHARED (exit 1)" in run.out
    assert "metadata: B was served up to" in run.out
    doc = orjson.loads(report.read_bytes())
    assert doc["verdict"] == "shared" and doc["exit_code"] == 1
    assert doc["cross"]["metadata"]["hits"] == 1
    assert doc["credentials"][1] == {"name": "B", "key": True, "headers": [], "body_fields": []}
    assert plot.read_bytes().startswith(b"\x89PNG")
    assert set(pooled.seen_keys) == {KEY_A, KEY_B}  # both credentials were really used
    for text in (run.out, run.err, report.read_text()):
        assert KEY_A not in text and KEY_B not in text


async def test_isolated_exits_0_and_json_goes_to_stdout(
    separate: SimServer, tmp_path: Path
) -> None:
    args = probe_args(separate.url, tmp_path, "--budget", "30", "--json")
    run = await kvfence(*args, env={"PROBE_KEY_A": KEY_A})
    assert run.code == 0, run.out + run.err
    doc = orjson.loads(run.out)
    assert doc["verdict"] == "isolated"
    assert doc["cross"]["rounds"] == 30 and doc["control"]["metadata"]["passed"]
    # The counter decides; timing corroborates where the host's load lets its control pass (on
    # a loaded 2-core host it may not), and the report says which.
    if doc["control"]["timing"]["passed"]:
        assert doc["power"]["power"] >= 0.9
    else:
        assert doc["power"] is None
        assert any(r.startswith("timing: A's own repeats were not") for r in doc["reasons"])
    assert "probe: cross 30/30 rounds" in run.err  # progress lines when stderr is not a terminal


async def test_model_not_served_exits_3_in_one_line(pooled: SimServer, tmp_path: Path) -> None:
    args = probe_args(pooled.url, tmp_path)
    args[args.index("sim")] = "gpt-nothing"
    run = await kvfence(*args, "--quiet", env={"PROBE_KEY_A": KEY_A})
    assert run.code == 3
    assert run.err.strip().splitlines() == [
        "kvfence probe: error: the endpoint does not serve model 'gpt-nothing' (404): "
        "The model `gpt-nothing` does not exist."
    ]
    assert run.out == ""


@pytest.mark.parametrize(
    ("extra", "env", "message"),
    [
        ((), {}, "credential A: environment variable PROBE_KEY_A is not set"),
        (("--key-a-env", "PROBE_SAME"), {"PROBE_SAME": KEY_B}, "credentials A and B are identical"),
        (("--header-a", "no colon"), {"PROBE_KEY_A": KEY_A}, "--header-a wants 'NAME: VALUE'"),
        (("--body-b", "[1]"), {"PROBE_KEY_A": KEY_A}, "--body-b must be a JSON object"),
        (
            ("--budget", "0"),
            {"PROBE_KEY_A": KEY_A},
            "the budget must be >= 1, the control needs >= 2 rounds",
        ),
    ],
)
async def test_bad_command_lines_exit_3_without_a_request(
    pooled: SimServer, tmp_path: Path, extra: tuple[str, ...], env: dict[str, str], message: str
) -> None:
    args = probe_args(pooled.url, tmp_path)
    if "--key-a-env" in extra:
        at = args.index("--key-a-env")
        del args[at : at + 2]
    run = await kvfence(*args, *extra, env=env)
    assert run.code == 3 and message in run.err
    assert pooled.seen_keys == []
    assert KEY_B not in run.err


async def test_missing_required_option_is_a_usage_error() -> None:
    run = await kvfence("probe", "--model", "m")
    assert run.code == 2 and "--base-url" in run.err


async def test_the_core_runs_without_scipy_or_matplotlib(pooled: SimServer, tmp_path: Path) -> None:
    """The extras stay optional: with both imports blocked a probe still reaches its verdict,
    and only --plot asks for matplotlib (before a single request is spent)."""
    block = "import sys; sys.modules['scipy'] = sys.modules['matplotlib'] = None; "
    run_cli = "from kvfence.cli import main; raise SystemExit(main(sys.argv[1:]))"
    args = probe_args(pooled.url, tmp_path, "--quiet")

    async def run(*extra: str) -> Run:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            block + run_cli,
            *args,
            *extra,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PROBE_KEY_A": KEY_A},
        )
        out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
        assert proc.returncode is not None
        return Run(proc.returncode, out.decode(), err.decode())

    shared = await run()
    assert shared.code == 1, shared.err
    requests = len(pooled.seen_keys)
    no_plot = await run("--plot", str(tmp_path / "p.png"))
    assert no_plot.code == 3 and "--plot needs matplotlib" in no_plot.err
    assert len(pooled.seen_keys) == requests
