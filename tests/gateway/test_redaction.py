"""No credential reaches a log line, at any level, whichever header carries it: the Azure-style
`api-key`, any `*-key`, `*-token`, `*-secret` header, cookies, handles, and key-shaped values in
any header; and a key inside a request the HTTP parser rejects is not logged either."""

from __future__ import annotations

import asyncio
import logging

import pytest

from kvfence.logs import REDACTED, JsonFormatter, is_credential_header, redact_headers
from tests.kit.gateway import KEYS, Gateway

CREDENTIAL_HEADERS = [
    "Authorization",
    "Proxy-Authorization",
    "X-API-Key",
    "api-key",  # Azure OpenAI's
    "Api_Key",
    "x-goog-api-key",
    "Ocp-Apim-Subscription-Key",
    "x-auth-token",
    "X-Amz-Security-Token",
    "x-session-secret",
    "x-db-password",
    "Cookie",
    "Set-Cookie",
    "x-kvfence-handle",
    "x_kvfence_handle",
    "x-kvfence-attestation",
    "X-Signature",
]
PLAIN_HEADERS = ["x-request-id", "Content-Type", "Host", "User-Agent", "Accept", "x-end-user"]


@pytest.mark.parametrize("name", CREDENTIAL_HEADERS)
def test_every_credential_header_name_is_redacted(name: str) -> None:
    assert is_credential_header(name)
    assert redact_headers([(name, "s3cr3t-value")]) == {name: REDACTED}


@pytest.mark.parametrize("name", PLAIN_HEADERS)
def test_plain_headers_stay_readable(name: str) -> None:
    assert redact_headers([(name, "value-1")]) == {name: "value-1"}


@pytest.mark.parametrize(
    "value", [KEYS["acme"], "Bearer abc", "basic dXNlcjpwYXNz", "kvh1.x.y", "kva1.a.b"]
)
def test_credential_shaped_values_are_redacted_in_any_header(value: str) -> None:
    assert redact_headers([("x-forwarded-whatever", value)])["x-forwarded-whatever"] == REDACTED


@pytest.mark.parametrize("header", ["api-key", "x-goog-api-key", "x-custom", "cookie"])
async def test_a_key_in_any_header_never_reaches_the_debug_log(
    gw: Gateway, caplog: pytest.LogCaptureFixture, header: str
) -> None:
    caplog.set_level(logging.DEBUG)
    resp = await gw.chat(
        "acme",
        {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]},
        **{header: KEYS["globex"]},
    )
    assert resp.status == 200
    assert any(r.getMessage() == "request" for r in caplog.records)  # the debug line exists
    text = "\n".join(JsonFormatter().format(r) for r in caplog.records)  # as written to stderr
    assert KEYS["globex"] not in text and KEYS["acme"] not in text


async def test_a_key_inside_a_rejected_request_is_not_logged(
    gw: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    """The parser's error message quotes the offending header line; it is never logged."""
    caplog.set_level(logging.DEBUG)
    host, port = gw.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    key = KEYS["acme"].encode()
    writer.write(b"GET /v1/models HTTP/1.1\r\nHost: gw\r\nApi-Key: " + key + b"\x00\r\n\r\n")
    async with asyncio.timeout(5):
        answer = await reader.read()
    writer.close()
    assert answer.startswith(b"HTTP/1.") and b" 400 " in answer.split(b"\r\n")[0]
    text = "\n".join(JsonFormatter().format(r) for r in caplog.records)
    assert KEYS["acme"] not in caplog.text and KEYS["acme"] not in text
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
