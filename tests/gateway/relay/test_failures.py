"""Every request that reaches the upstream step gets exactly one audit record, whatever the
upstream does: reset before its headers, stall past the first-byte deadline, answer something
that is not HTTP, die inside a plain body, or cut a close-delimited stream short. The client gets
the right 502/504, or, once a stream has started, an error event and never `[DONE]`."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from gateway.policy.load import parse_policy
from tests.fakes.raw_upstream import RawUpstream
from tests.kit.gateway import ENV, QUICK_TIMEOUTS, Gateway, policy_text, run_gateway

AUDIT_KEY = "audit-key-0123456789abcdef"
# (mode, streamed?, status the client sees, the record's reason)
CASES = [
    ("reset", False, 502, "upstream_unavailable"),
    ("reset", True, 502, "upstream_unavailable"),
    ("stall", False, 504, "upstream_timeout"),
    ("stall", True, 504, "upstream_timeout"),
    ("not_http", False, 502, "upstream_unavailable"),
    ("not_http", True, 502, "upstream_unavailable"),
    ("short_body", False, 502, "upstream_unavailable"),
    ("unframed_cut", True, 200, "upstream_unavailable"),
]


def records(log: Path) -> list[dict[str, object]]:
    rows = [orjson.loads(line) for line in log.read_bytes().splitlines()]
    return [r for r in rows if r.get("kind") == "record" and r.get("phase") != "open"]


@pytest.mark.parametrize(("mode", "stream", "status", "reason"), CASES)
async def test_each_failure_is_answered_and_recorded_once(
    tmp_path: Path, mode: str, stream: bool, status: int, reason: str
) -> None:
    upstream = RawUpstream(mode)
    await upstream.start()
    log = tmp_path / "audit.jsonl"
    text = policy_text(upstream.url, timeouts=QUICK_TIMEOUTS).replace(
        "access_log: false",
        f"access_log: false\n  audit_log: {{path: {log}, key: {{env: AUDIT}}}}",
    )
    policy = parse_policy(text, "p", env={**ENV, "AUDIT": AUDIT_KEY})
    gw, runner = await run_gateway(policy, upstream)  # type: ignore[arg-type]
    try:
        await _check(gw, log, stream, status, reason)
        assert upstream.requests == 1
    finally:
        await gw.session.close()
        await runner.cleanup()
        await upstream.close()


async def _check(gw: Gateway, log: Path, stream: bool, status: int, reason: str) -> None:
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    resp = await gw.chat("acme", body)
    raw = await resp.read()
    assert resp.status == status, raw
    if status == 200:  # the stream had started: an error event, never [DONE]
        assert b"event: error" in raw and b"[DONE]" not in raw
    else:
        assert orjson.loads(raw)["error"]["code"] == reason
    [record] = records(log)
    assert (record["status"], record["reason"]) == (502 if status == 200 else status, reason)
