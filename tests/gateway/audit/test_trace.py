"""OpenTelemetry traces (`gateway.tracing`, the `otel` extra): one span per request that reaches
a backend, with the GenAI conventions' names and kvfence's tenant and verdict, a child of the
client's `traceparent`, never a prompt; exported over OTLP/HTTP to a collector; none at all
without `gateway.tracing`."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra (scripts/test installs it)")

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from gateway.app import create_app
from gateway.audit.trace import TRACES, Traces
from gateway.policy.load import parse_policy
from gateway.policy.model import TracingSettings
from gateway.server import bound_port, start
from tests.fakes.openai_upstream import CACHED_TOKENS, FakeUpstream
from tests.fakes.otlp_collector import FakeCollector
from tests.kit.gateway import ENV, Gateway, make_policy, policy_text, run_gateway
from tests.kit.polling import until

PROMPT = "a secret prompt about the merger"
MSG = [{"role": "user", "content": PROMPT}]
PARENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{PARENT_TRACE}-00f067aa0ba902b7-01"


@pytest.fixture
async def traced(upstream: FakeUpstream) -> AsyncIterator[tuple[Gateway, InMemorySpanExporter]]:
    import aiohttp

    exporter = InMemorySpanExporter()
    app = create_app(make_policy(upstream.url))
    app[TRACES] = Traces(TracingSettings("http://127.0.0.1:9/v1/traces"), exporter=exporter)
    runner = await start(app, "127.0.0.1", 0)
    session = aiohttp.ClientSession()
    yield Gateway(f"http://127.0.0.1:{bound_port(runner)}", upstream, app, session), exporter
    await session.close()
    await runner.cleanup()


async def test_one_span_per_request_with_the_genai_attributes(
    traced: tuple[Gateway, InMemorySpanExporter],
) -> None:
    gw, exporter = traced
    assert (await gw.chat("acme", {"model": "smollm2", "messages": MSG})).status == 200
    body = {"model": "smollm2", "messages": MSG, "stream": True}
    resp = await gw.chat("globex", body, traceparent=TRACEPARENT)
    assert resp.status == 200 and (await resp.read()).endswith(b"[DONE]\n\n")
    assert (await gw.chat("acme", {"model": "nope", "messages": MSG})).status == 404  # no span
    plain, stream = exporter.get_finished_spans()
    assert plain.name == "chat smollm2" and plain.kind is SpanKind.CLIENT
    attrs = dict(plain.attributes or {})
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.request.model"] == "smollm2"
    assert attrs["gen_ai.provider.name"] == "vllm"
    assert attrs["gen_ai.usage.input_tokens"] == 12 and attrs["gen_ai.usage.output_tokens"] == 3
    assert attrs["gen_ai.usage.cache_read.input_tokens"] == CACHED_TOKENS
    assert attrs["kvfence.tenant"] == "acme" and attrs["kvfence.verdict"] == "unverified"
    assert attrs["http.response.status_code"] == 200
    assert "gen_ai.response.time_to_first_chunk" not in attrs  # a plain answer
    s_attrs = dict(stream.attributes or {})
    assert s_attrs["kvfence.tenant"] == "globex" and s_attrs["gen_ai.request.stream"] is True
    assert float(s_attrs["gen_ai.response.time_to_first_chunk"]) > 0  # type: ignore[arg-type]
    assert format(stream.context.trace_id, "032x") == PARENT_TRACE  # the client's trace
    assert plain.parent is None
    assert plain.end_time is not None and plain.start_time is not None
    assert plain.end_time > plain.start_time
    for span in (plain, stream):
        assert all(PROMPT not in str(v) for v in (span.attributes or {}).values())


async def test_a_withheld_or_failed_answer_is_an_error_span(
    traced: tuple[Gateway, InMemorySpanExporter],
) -> None:
    gw, exporter = traced
    gw.upstream.mode = "die_before"
    assert (await gw.chat("acme", {"model": "smollm2", "messages": MSG})).status == 502
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code.name == "ERROR"
    assert dict(span.attributes or {})["error.type"] == "upstream_unavailable"


async def test_spans_reach_an_otlp_collector(upstream: FakeUpstream) -> None:
    collector = FakeCollector()
    await collector.start()
    tracing = (
        f"  tracing: {{otlp_endpoint: {collector.url}/v1/traces, batch_delay_s: 0.1, "
        "service_name: gw-test}\n"
    )
    text = policy_text(upstream.url).replace("gateway:\n", "gateway:\n" + tracing, 1)
    gw, runner = await run_gateway(parse_policy(text, "t.yaml", env=ENV), upstream)
    try:
        for tenant in ("acme", "globex"):
            assert (await gw.chat(tenant, {"model": "smollm2", "messages": MSG})).status == 200
        await until(lambda: len(collector.spans) == 2, what="both spans exported")
        assert [s.attributes["kvfence.tenant"] for s in collector.spans] == ["acme", "globex"]
        assert {s.service for s in collector.spans} == {"gw-test"}
        assert all(s.name == "chat smollm2" and s.kind == 3 for s in collector.spans)  # CLIENT
    finally:
        await gw.session.close()
        await runner.cleanup()
        await collector.close()


async def test_no_tracing_without_the_policy_section(gw: Gateway) -> None:
    assert TRACES not in gw.app
