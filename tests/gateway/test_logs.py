"""Log lines are JSON and never carry credentials or handles."""

import logging

import orjson
import pytest

from kvfence.logs import JsonFormatter, redact_headers
from tests.kit.gateway import KEYS, Gateway


def test_redaction_drops_credentials_and_handles() -> None:
    headers = [
        ("Authorization", "Bearer k"),
        ("X-API-Key", "k"),
        ("Cookie", "c"),
        ("x_kvfence_handle", "h"),
        ("x-request-id", "r1"),
    ]
    out = redact_headers(headers)
    assert out["x-request-id"] == "r1"
    assert {k for k, v in out.items() if v == "<redacted>"} == {
        "Authorization",
        "X-API-Key",
        "Cookie",
        "x_kvfence_handle",
    }


def test_formatter_emits_one_json_object() -> None:
    record = logging.makeLogRecord(
        {"msg": "hello %s", "args": ("you",), "levelname": "INFO", "name": "x", "rid": "r1"}
    )
    line = JsonFormatter().format(record)
    assert "\n" not in line
    assert orjson.loads(line) | {"ts": 0} == {
        "ts": 0,
        "level": "info",
        "logger": "x",
        "msg": "hello you",
        "rid": "r1",
    }


async def test_debug_log_has_no_key_or_prompt(
    gw: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="kvfence")
    resp = await gw.chat(
        "acme", {"model": "smollm2", "messages": [{"role": "user", "content": "SECRETPROMPT"}]}
    )
    assert resp.status == 200
    text = "\n".join(JsonFormatter().format(r) for r in caplog.records)
    assert "<redacted>" in text
    assert KEYS["acme"] not in text and "SECRETPROMPT" not in text
