"""What a client may see of attestations: nothing, wherever a backend put one; every other byte
of the answer as it was."""

from __future__ import annotations

import orjson

from gateway.audit.events import strip_body, strip_events

TEXT = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\r\n\r\n'


def test_events_without_an_attestation_keep_their_exact_bytes() -> None:
    events = b": comment\n\n" + TEXT + b'data: {"a": 1,  "b":2}\n\n'
    assert strip_events(events) is events


def test_every_attestation_is_taken_out_and_nothing_else() -> None:
    named = b'event: kvfence-attestation\ndata: {"kvfence_attestation":"TOKEN"}\n\n'
    nested = b'data: {"choices":[{"text":"x","kvfence_attestation":"TOKEN"}]}\n\n'
    raw = b"data: kvfence_attestation=TOKEN\n\n"  # not JSON: the whole event goes
    out = strip_events(TEXT + named + nested + raw + TEXT)
    assert b"TOKEN" not in out and b"kvfence" not in out
    assert out == TEXT + b'data: {"choices":[{"text":"x"}]}\n\n' + TEXT


def test_a_plain_answer_loses_its_attestation_field_at_any_depth() -> None:
    body = orjson.dumps({"choices": [{"text": "x", "kvfence_attestation": "TOKEN"}], "id": 1})
    assert orjson.loads(strip_body(body, orjson.loads(body))) == {"choices": [{"text": "x"}],
                                                                  "id": 1}  # fmt: skip
    assert strip_body(b"line one\nkvfence_attestation: TOKEN\n", None) == b"line one\n"
    clean = b'{"choices": []}'
    assert strip_body(clean, orjson.loads(clean)) is clean
