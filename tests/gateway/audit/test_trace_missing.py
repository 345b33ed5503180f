"""A policy that asks for traces on a gateway without the `otel` extra gets one line naming the
extra, whether none of OpenTelemetry is installed or only part of it (a dotted module whose
parent package is absent raises on lookup: that is a missing extra, not a crash)."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from gateway.audit import trace
from gateway.policy.load import parse_policy
from tests.kit.gateway import ENV, policy_text

LINE = "the policy sets gateway.tracing, which needs: pip install 'kvfence[gateway,otel]'"


def traced_policy() -> Any:
    text = policy_text("http://127.0.0.1:9").replace(
        "  access_log: false\n",
        "  access_log: false\n  tracing: {otlp_endpoint: http://127.0.0.1:9/v1/traces}\n",
        1,
    )
    return parse_policy(text, "p.yaml", env=ENV)


def absent(missing: str) -> Any:
    """`importlib.util.find_spec` as it behaves without `missing` installed: the package itself
    is not found, and looking up a module inside an absent top-level package raises."""
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> Any:
        if name == missing or name.startswith(missing + "."):
            if name != missing and "." not in missing:
                raise ModuleNotFoundError(f"No module named {missing!r}")
            return None
        return real(name, package)

    return find_spec


@pytest.mark.parametrize("missing", ["opentelemetry", "opentelemetry.exporter"])
def test_a_policy_with_traces_without_the_extra_names_it(
    monkeypatch: pytest.MonkeyPatch, missing: str
) -> None:
    policy = traced_policy()
    assert policy.gateway.tracing is not None
    monkeypatch.setattr(importlib.util, "find_spec", absent(missing))
    assert trace.missing_support(policy) == LINE


def test_no_line_without_tracing() -> None:
    assert (
        trace.missing_support(parse_policy(policy_text("http://127.0.0.1:9"), "p.yaml", env=ENV))
        is None
    )
