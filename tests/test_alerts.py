"""The shipped Prometheus alert rules (deploy/prometheus/): `promtool` accepts them and their unit
tests pass (each alert fires on the series that should fire it and stays silent otherwise), and
every metric they read is one docs/metrics.md documents."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy" / "prometheus" / "kvfence-alerts.yml"
PROMTOOL = shutil.which("promtool")


def _promtool() -> str:
    if PROMTOOL is None:
        if os.environ.get("KVFENCE_REQUIRE_PROMTOOL") == "1":
            pytest.fail("KVFENCE_REQUIRE_PROMTOOL=1 but promtool is not installed")
        pytest.skip("promtool not installed (Debian's prometheus package; scripts/test adds it)")
    return PROMTOOL


@pytest.mark.parametrize("check", ["check", "test"])
def test_promtool_accepts_and_tests_the_rules(check: str) -> None:
    target = RULES if check == "check" else RULES.with_suffix(".test.yml")
    done = subprocess.run(
        [_promtool(), f"{check}", "rules", target.name],
        cwd=RULES.parent, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_metric_the_rules_read_is_documented() -> None:
    used = set(re.findall(r"kvfence_gateway_[a-z_]+", RULES.read_text()))
    documented = (ROOT / "docs" / "metrics.md").read_text()
    missing = sorted(m for m in used if f"`{m}`" not in documented)
    assert len(used) >= 10 and missing == []
