"""The GPU check's figures from its raw measurements, and the table it prints: ours against
transformers, batch-1 decode against the bandwidth roofline, the gateway's cost, the goals.

Invariant: pure functions of the report dictionary (no torch, no clock), so the arithmetic is
tested on fixed numbers; a figure whose inputs are missing is None, never a guess.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

RATIO_GOAL_STREAMS = 64
RATIO_GOAL = 5.0  # ours / transformers tokens per second at RATIO_GOAL_STREAMS streams
GATEWAY_COST_GOAL = 0.05  # the gateway's share of direct tokens per second it may lose


def roofline(
    copy_gb_s: float, weight_bytes: int, kv_bytes: int, decode_tps: float
) -> dict[str, Any]:
    """Tokens/s the copy bandwidth allows at batch 1 (each token reads the weights once and its
    KV), and the decode rate's share of it."""
    per_token = weight_bytes + kv_bytes
    limit = copy_gb_s * 1e9 / per_token
    return {
        "bytes_per_token": per_token,
        "roofline_tokens_per_s": round(limit, 1),
        "decode_tokens_per_s_batch1": round(decode_tps, 1),
        "decode_share_of_roofline": round(decode_tps / limit, 4),
    }


def gateway_cost(direct_tps: float, gateway_tps: float) -> float:
    """The share of the direct rate lost through the gateway (negative: the gateway was faster)."""
    return round(1.0 - gateway_tps / direct_tps, 4)


def ratios(
    ours: Sequence[Mapping[str, Any]], theirs: Sequence[Mapping[str, Any]]
) -> dict[int, float]:
    """streams -> our prefix-miss tokens/s over transformers' at the same stream count."""
    hf = {int(r["streams"]): float(r["tokens_per_s"]) for r in theirs if r.get("tokens_per_s")}
    return {
        int(r["streams"]): round(float(r["tokens_per_s"]) / hf[int(r["streams"])], 2)
        for r in ours
        if r["prefix"] == "miss" and int(r["streams"]) in hf
    }


def goals(report: Mapping[str, Any]) -> dict[str, Any]:
    """Each goal with its figure and whether it holds (None: not measured in this run)."""
    engine = report.get("engine", {})
    gateway = report.get("gateway", {})
    found = ratios(engine.get("throughput", ()), report.get("transformers", {}).get("rows", ()))
    ratio = found.get(RATIO_GOAL_STREAMS)
    costs = [
        r["gateway_cost"] for r in gateway.get("rows", ()) if r.get("gateway_cost") is not None
    ]
    worst = max(costs) if costs else None
    checks = engine.get("checks", {})
    return {
        "ours_over_transformers": found,
        f"ratio_at_{RATIO_GOAL_STREAMS}_streams_at_least_{RATIO_GOAL:g}x": _holds(
            ratio, ratio is not None and ratio >= RATIO_GOAL
        ),
        "gateway_cost_under_5_percent": _holds(
            worst, worst is not None and worst < GATEWAY_COST_GOAL
        ),
        "decode_graphs_same_tokens": _all(
            r["same_tokens"]
            for r in engine.get("usual_path", {}).get("rows", ())
            if r.get("same_tokens") is not None
        ),
        "reference_answer": checks.get("reference_ok"),
        "batched_equals_alone": checks.get("batched_equals_alone"),
        "engine_isolation": checks.get("isolation_ok"),
        "gateway_isolation": _all(r["isolation"]["ok"] for r in gateway.get("rows", ())),
        "audit_log_verifies": _all(a.get("ok") for a in gateway.get("audit", ())),
    }


def _holds(figure: float | None, ok: bool) -> dict[str, Any]:
    return {"figure": figure, "ok": ok if figure is not None else None}


def _all(values: Any) -> bool | None:
    seen = list(values)
    return all(seen) if seen else None


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    cells = [[_cell(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(head)]
    line = "  ".join(h.rjust(w) for h, w in zip(head, widths, strict=True))
    return [line, *("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells)]


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.3g}"
    return str(value)


def render(report: Mapping[str, Any]) -> str:
    """The readable summary: one table per section, then the goals."""
    engine, hf = report.get("engine", {}), report.get("transformers", {})
    hf_rate = {int(r["streams"]): r.get("tokens_per_s") for r in hf.get("rows", ())}
    found = ratios(engine.get("throughput", ()), hf.get("rows", ()))
    out = [
        f"device: {report.get('device')}  torch {report.get('torch')}  dtype {engine.get('dtype')}"
    ]
    rows = [
        [r["streams"], r["prefix"], r["tokens_per_s"], r["all_first_tokens_ms"], r["cached_tokens"],
         hf_rate.get(r["streams"]) if r["prefix"] == "miss" else None,
         found.get(r["streams"]) if r["prefix"] == "miss" else None]
        for r in engine.get("throughput", ())
    ]  # fmt: skip
    head = [
        "streams",
        "prefix",
        "ours tok/s",
        "first tokens ms",
        "cached",
        "transformers tok/s",
        "ours/tf",
    ]
    out += ["", *_table(head, rows)]
    if "greedy_tokens_alike" in hf:
        out.append(f"transformers and ours chose the same first {hf['greedy_tokens_alike']} "
                   f"greedy tokens at {rows[0][0] if rows else '-'} stream(s)")  # fmt: skip
    usual = engine.get("usual_path", {}).get("rows", ())
    if usual:
        rows = [[r["streams"], r["graphs_tokens_per_s"], r["tokens_per_s"], r["same_tokens"]]
                for r in usual]  # fmt: skip
        head = ["streams", "graphs tok/s", "usual path tok/s", "same tokens"]
        out += ["", f"decode steps: {engine.get('runner', {}).get('decode_steps')}",
                *_table(head, rows)]  # fmt: skip
    calls = report.get("attention", {}).get("rows", ())
    if calls:
        rows = [[r["batch"], r["context"], r["ours_us"], r["gathered_us"],
                 round(r["ours_us"] / r["gathered_us"], 2) if r["gathered_us"] else None]
                for r in calls]  # fmt: skip
        head = ["batch", "context", "ours us", "gathered us", "ours/gathered"]
        out += ["", "decode attention, one call:", *_table(head, rows)]
    line = report.get("roofline", {})
    if "copy_gb_s" in line:
        out += ["", *_table(
            ["copy GB/s", "bytes/token", "roofline tok/s", "batch-1 decode tok/s", "share"],
            [[line["copy_gb_s"], line["bytes_per_token"], line["roofline_tokens_per_s"],
              line["decode_tokens_per_s_batch1"], line["decode_share_of_roofline"]]],
        )]  # fmt: skip
    gateway = report.get("gateway", {})
    if gateway.get("rows"):
        rows = [
            [r["workers"], r["streams"], r["direct_tokens_per_s"], r["gateway_tokens_per_s"],
             None if r["gateway_cost"] is None else f"{100 * r['gateway_cost']:.1f}%"]
            for r in gateway["rows"]
        ]  # fmt: skip
        out += ["", *_table(["workers", "streams", "direct tok/s", "gateway tok/s", "cost"], rows)]
    for name, part in report.items():
        if isinstance(part, dict) and "error" in part:
            out += ["", f"{name} FAILED: {part['error']}"]
        elif isinstance(part, dict) and "skipped" in part:
            out += ["", f"{name} skipped: {part['skipped']}"]
    out += ["", "goals and checks:"]
    for name, value in goals(report).items():
        if name != "ours_over_transformers":
            shown = (
                value
                if not isinstance(value, dict)
                else f"{value['ok']} ({_cell(value['figure'])})"
            )
            out.append(f"  {name}: {shown}")
    return "\n".join(out)
