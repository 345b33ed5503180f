"""The GPU check's arithmetic on fixed numbers, and its carry's split and join of the model."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from bench.gpu import carry, summary


def test_roofline_is_bandwidth_over_bytes_per_token() -> None:
    found = summary.roofline(4000.0, weight_bytes=270_000_000, kv_bytes=10_000_000, decode_tps=700)
    assert found["bytes_per_token"] == 280_000_000
    assert found["roofline_tokens_per_s"] == pytest.approx(4000e9 / 280e6, abs=0.1)
    assert found["decode_share_of_roofline"] == pytest.approx(700 / (4000e9 / 280e6), abs=1e-4)


def test_gateway_cost_is_the_share_of_the_direct_rate_lost() -> None:
    assert summary.gateway_cost(1000.0, 960.0) == pytest.approx(0.04)
    assert summary.gateway_cost(1000.0, 1010.0) == pytest.approx(-0.01)


def _report(ours_64: float, gateway_cost: float) -> dict[str, object]:
    engine_rows = [
        {
            "streams": s,
            "prefix": p,
            "tokens_per_s": t,
            "all_first_tokens_ms": 1.0,
            "cached_tokens": 0,
        }
        for s, p, t in ((1, "miss", 100.0), (1, "hit", 150.0), (64, "miss", ours_64))
    ]
    checks = {"reference_ok": True, "batched_equals_alone": True, "isolation_ok": True}
    gateway_row = {"workers": 4, "streams": 64, "direct_tokens_per_s": 5000.0,
                   "gateway_tokens_per_s": 4900.0, "gateway_cost": gateway_cost,
                   "isolation": {"ok": True}}  # fmt: skip
    return {
        "engine": {"throughput": engine_rows, "checks": checks},
        "transformers": {
            "rows": [{"streams": 1, "tokens_per_s": 50.0}, {"streams": 64, "tokens_per_s": 1000.0}]
        },
        "gateway": {"rows": [gateway_row], "audit": [{"ok": True}]},
        "roofline": {"error": "RuntimeError('no device')"},
    }


def test_goals_compare_miss_rows_at_the_same_stream_count() -> None:
    met = summary.goals(_report(ours_64=5200.0, gateway_cost=0.02))
    assert met["ours_over_transformers"] == {1: 2.0, 64: 5.2}
    assert met["ratio_at_64_streams_at_least_5x"] == {"figure": 5.2, "ok": True}
    assert met["gateway_cost_under_5_percent"] == {"figure": 0.02, "ok": True}
    missed = summary.goals(_report(ours_64=4000.0, gateway_cost=0.08))
    assert missed["ratio_at_64_streams_at_least_5x"]["ok"] is False
    assert missed["gateway_cost_under_5_percent"]["ok"] is False


def test_render_names_a_failed_section_and_keeps_the_others() -> None:
    text = summary.render(_report(ours_64=5200.0, gateway_cost=0.02))
    assert "roofline FAILED: RuntimeError('no device')" in text
    assert "5.2" in text and "2.0%" in text


def test_carry_joins_the_parts_it_split(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(bytes(range(256)) * 40)
    manifest = carry.split_model(model, tmp_path / "carry" / "model", part_bytes=4096)
    assert len(manifest.parts) == 3
    stash = tmp_path / "stash"
    carry.stash_parts(tmp_path / "carry", stash)
    (stash / manifest.parts[-1]).unlink()  # the last part has not come yet
    assert carry.join_parts(manifest, stash) is None
    carry.stash_parts(tmp_path / "carry", stash)
    joined = carry.join_parts(manifest, stash)
    assert joined is not None and joined.read_bytes() == model.read_bytes()
    assert json.loads((tmp_path / "carry" / "model" / "manifest.json").read_text())["size"] == 10240


def test_carry_refuses_a_part_that_does_not_match(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x" * 9000)
    manifest = carry.split_model(model, tmp_path / "carry" / "model", part_bytes=4096)
    stash = tmp_path / "stash"
    carry.stash_parts(tmp_path / "carry", stash)
    (stash / manifest.parts[0]).write_bytes(b"y" * 4096)
    with pytest.raises(SystemExit, match="SHA-256"):
        carry.join_parts(manifest, stash)


def test_carry_unpacks_only_wheels_whose_module_is_missing(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for dist in ("json", "kvfence_carry_probe"):  # json is always importable
        with zipfile.ZipFile(wheels / f"{dist}-1.0-py3-none-any.whl", "w") as archive:
            archive.writestr(f"{dist}/__init__.py", "")
    assert carry.install_missing(wheels, tmp_path / "site") == [
        "kvfence_carry_probe-1.0-py3-none-any.whl"
    ]
    assert (tmp_path / "site" / "kvfence_carry_probe" / "__init__.py").is_file()


def test_carry_compares_versions_by_their_numbers() -> None:
    assert carry._numbers("41.0.7") < carry._numbers("50.0.2")
    assert carry._numbers("3.10.0") > carry._numbers("3.9.15")
    assert carry._numbers("2.1.1") == carry._numbers("2.1.1.post1")


def test_decode_graphs_hold_where_every_row_chose_the_same_tokens() -> None:
    report = _report(ours_64=5200.0, gateway_cost=0.02)
    assert summary.goals(report)["decode_graphs_same_tokens"] is None  # not measured
    rows = [{"streams": 1, "tokens_per_s": 90.0, "graphs_tokens_per_s": 300.0, "same_tokens": True},
            {"streams": 64, "tokens_per_s": 2000.0, "graphs_tokens_per_s": 5200.0,
             "same_tokens": True}]  # fmt: skip
    report["engine"]["usual_path"] = {"rows": rows}  # type: ignore[index]
    report["engine"]["runner"] = {"decode_steps": "CUDA graphs"}  # type: ignore[index]
    assert summary.goals(report)["decode_graphs_same_tokens"] is True
    text = summary.render(report)
    assert "decode steps: CUDA graphs" in text and "usual path tok/s" in text
    rows[1]["same_tokens"] = False
    assert summary.goals(report)["decode_graphs_same_tokens"] is False


def test_render_shows_one_attention_call_both_ways() -> None:
    report = _report(ours_64=5200.0, gateway_cost=0.02)
    call = {"batch": 8, "context": 2048, "ours_us": 30.0, "gathered_us": 120.0}
    report["attention"] = {"rows": [call | {"largest_difference": 0.004}]}
    lines = summary.render(report).splitlines()
    at = lines.index("decode attention, one call:")
    assert lines[at + 2].split() == ["8", "2,048", "30.0", "120.0", "0.25"]
