"""A probe result for people (the summary) and for machines (the JSON report).

Invariant: both are built only from the result, the endpoint's safe URL and the identities'
`describe()`, so neither can carry a key, a header value, a body field's value or a prompt.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from kvfence.probe.client import Endpoint, Identity
from kvfence.probe.findings import ArmTimes
from kvfence.probe.method import ProbeResult
from kvfence.probe.rounds import Phase

REPORT_VERSION = 1


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 2)


def _arm(times: ArmTimes) -> dict[str, Any]:
    return {"n": times.n, "median_ms": _ms(times.median_s)}


def _effect_ms(hit: ArmTimes, miss: ArmTimes) -> float | None:
    if hit.median_s is None or miss.median_s is None:
        return None
    return _ms(miss.median_s - hit.median_s)


def to_json(result: ProbeResult, endpoint: Endpoint, a: Identity, b: Identity) -> dict[str, Any]:
    meta, timing, decision = result.metadata, result.timing, result.decision
    settings = asdict(result.config) | {"test": str(result.config.test)}
    return {
        "kvfence_probe": REPORT_VERSION,
        "verdict": str(decision.outcome),
        "exit_code": decision.exit_code,
        "reasons": list(decision.reasons),
        "endpoint": {"url": endpoint.safe_url(), "model": endpoint.model, "api": str(endpoint.api)},
        "credentials": [a.describe(), b.describe()],
        "settings": settings,
        "schedule": [{"n": look.n, "alpha": look.alpha} for look in result.schedule.looks],
        "control": {
            "rounds": result.config.control_rounds,
            "metadata": {
                "available": meta.available,
                "hits": meta.control_hits,
                "of": meta.control_total,
                "passed": meta.control_passed,
            },
            "timing": {
                "p_value": timing.control_p,
                "alpha": timing.control_alpha,
                "auc": timing.control_auc,
                "passed": timing.control_passed,
                "hit": _arm(timing.control_hit),
                "miss": _arm(timing.control_miss),
                "effect_ms": _effect_ms(timing.control_hit, timing.control_miss),
            },
        },
        "cross": {
            "rounds": result.rounds,
            "metadata": {
                "hits": meta.cross_hits,
                "excess_tokens": list(meta.cross_excess),
                "partial_hits": meta.partial_hits,
                "partial_excess_tokens": list(meta.partial_excess),
                "shared": meta.shared,
            },
            "timing": {
                "looks": [asdict(look) for look in timing.looks],
                "p_value": timing.p_value,
                "auc": timing.cross_auc,
                "hit": _arm(timing.cross_hit),
                "miss": _arm(timing.cross_miss),
                "partial": _arm(timing.partial),
                "effect_ms": _effect_ms(timing.cross_hit, timing.cross_miss),
                "shared": timing.shared,
            },
        },
        "power": asdict(decision.timing_power) if decision.timing_power else None,
        "spent": {
            "requests": result.requests,
            "prompt_tokens": result.tokens,
            "seconds": round(result.elapsed_s, 2),
        },
        "measurements": [
            {
                "phase": str(m.phase),
                "arm": str(m.arm),
                "attacker": m.attacker,
                "ttft_ms": _ms(m.ttft_s),
                "cached_tokens": m.cached_tokens,
                "prompt_tokens": m.prompt_tokens,
            }
            for m in result.measurements
        ],
    }


def _fmt_ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f} ms"


def _fmt_p(value: float | None) -> str:
    return "-" if value is None else f"{value:.2g}"


def _times_line(label: str, hit: ArmTimes, miss: ArmTimes, auc: float | None, p: str) -> str:
    effect = _effect_ms(hit, miss)
    gain = "-" if effect is None else f"{effect:+.0f} ms"
    auc_text = "-" if auc is None else f"{auc:.3f}"
    return (
        f"  {label:<9} first token: hit median {_fmt_ms(hit.median_s)}, miss median "
        f"{_fmt_ms(miss.median_s)} (miss - hit {gain}, AUC {auc_text}, n = {hit.n}/{miss.n}), {p}"
    )


def summary(result: ProbeResult, endpoint: Endpoint) -> str:
    meta, timing, decision = result.metadata, result.timing, result.decision
    test = str(result.config.test)
    lines = [
        f"kvfence probe  {endpoint.safe_url()}  model {endpoint.model}",
        f"verdict: {decision.outcome.value.upper()} (exit {decision.exit_code})",
        *(f"  - {reason}" for reason in decision.reasons),
        f"control: A primes, A probes: {result.config.control_rounds} rounds",
    ]
    if meta.available:
        lines.append(
            f"  metadata  {meta.control_hits} of {meta.control_total} repeats hit "
            f"(>= {meta.block_tokens} cached tokens beyond the fresh-prompt baseline)"
        )
    lines.append(
        _times_line(
            "timing",
            timing.control_hit,
            timing.control_miss,
            timing.control_auc,
            f"rank-sum p = {_fmt_p(timing.control_p)}",
        )
    )
    lines.append(
        f"cross: A primes, B probes: {result.rounds} of at most {result.schedule.budget} rounds"
    )
    if meta.available:
        lines.append(
            f"  metadata  {meta.cross_hits} of {len(meta.cross_excess)} shared-prefix and "
            f"{meta.partial_hits} of {len(meta.partial_excess)} partial-prefix requests hit"
        )
    looks = ", ".join(
        f"n={look.n}: p={look.p_value:.2g} vs {look.alpha:.2g}" for look in timing.looks
    )
    lines.append(
        _times_line(
            "timing",
            timing.cross_hit,
            timing.cross_miss,
            timing.cross_auc,
            f"{test} {looks}" if looks else "no look reached",
        )
    )
    if decision.timing_power is not None:
        tp = decision.timing_power
        lines.append(
            f"  power     {tp.power:.2f} against AUC {tp.target_auc:.3f} "
            f"({tp.min_effect:.0%} of the control's effect); this schedule detects "
            f"AUC >= {tp.detectable_auc} at power 0.9"
        )
    skipped = (
        "" if any(m.phase is Phase.CROSS for m in result.measurements) else ", no cross rounds"
    )
    lines.append(
        f"spent: {result.requests} requests, {result.tokens} prompt tokens, "
        f"{result.elapsed_s:.1f} s{skipped}"
    )
    return "\n".join(lines)
