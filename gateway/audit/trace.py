"""OpenTelemetry traces of the gateway (the `otel` extra, off unless the policy has
`gateway.tracing`): one span per upstream attempt, named and described after the GenAI semantic
conventions (`gen_ai.operation.name`, `gen_ai.request.model`, `gen_ai.usage.*`,
`gen_ai.response.time_to_first_chunk`) plus kvfence's own (`kvfence.tenant`, `kvfence.verdict`,
`kvfence.backend`), exported over OTLP/HTTP in batches from a background thread; a client's
`traceparent` makes it a child of the client's trace. Settle calls `record`, once per attempt.

Invariant: a span never carries a prompt, an answer, a key or a namespace (only its label);
exporting never runs on the event loop; the SDK is imported only when tracing is on.
"""

from __future__ import annotations

import importlib.util
import time
from typing import TYPE_CHECKING, Any, Final

from aiohttp import web
from yarl import URL

from gateway.audit.judge import Answer, AuditContext, Judgement
from gateway.inputs.paths import CHAT, COMPLETIONS, DETOKENIZE, EMBEDDINGS, RESPONSES, TOKENIZE
from gateway.policy.model import Policy, TracingSettings
from gateway.state import API_KEY, BODY, TIMING
from kvfence.namespace import namespace_label

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

OPERATION: Final = {
    CHAT: "chat",
    COMPLETIONS: "text_completion",
    RESPONSES: "chat",
    EMBEDDINGS: "embeddings",
    TOKENIZE: "tokenize",
    DETOKENIZE: "detokenize",
}


def _found(module: str) -> bool:
    """Whether `module` can be imported (a dotted name whose parent package is absent is not)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def missing_support(policy: Policy) -> str | None:
    """One line naming the extra to install when the policy asks for traces and it is absent."""
    if policy.gateway.tracing is None:
        return None
    if all(
        _found(name) for name in ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http")
    ):
        return None
    return "the policy sets gateway.tracing, which needs: pip install 'kvfence[gateway,otel]'"


def _headers(settings: TracingSettings) -> dict[str, str]:
    if settings.headers is None:
        return {}
    pairs = (p.partition("=") for p in settings.headers.value.decode().split(","))
    return {k.strip(): v.strip() for k, _, v in pairs if k.strip()}


class Traces:
    """One tracer provider per worker (made after the fork, in `create_app`)."""

    def __init__(self, settings: TracingSettings, exporter: SpanExporter | None = None) -> None:
        """`exporter`: where spans go at once (tests); default: OTLP/HTTP to the policy's
        endpoint, in batches."""
        from opentelemetry.propagators.textmap import DefaultGetter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
        from opentelemetry.trace import SpanKind, StatusCode
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        sampler = ParentBased(TraceIdRatioBased(settings.sample_ratio))
        resource = Resource.create({"service.name": settings.service_name})
        self.provider: TracerProvider = TracerProvider(resource=resource, sampler=sampler)
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            otlp = OTLPSpanExporter(endpoint=settings.otlp_endpoint, headers=_headers(settings))
            delay = settings.batch_delay_s * 1000
            self.provider.add_span_processor(BatchSpanProcessor(otlp, schedule_delay_millis=delay))
        else:
            self.provider.add_span_processor(SimpleSpanProcessor(exporter))
        self._tracer = self.provider.get_tracer("kvfence.gateway")
        self._propagator = TraceContextTextMapPropagator()
        self._getter = DefaultGetter()
        self._client, self._error = SpanKind.CLIENT, StatusCode.ERROR

    def record(
        self,
        request: web.Request,
        ctx: AuditContext,
        answer: Answer,
        judgement: Judgement,
        status: int,
        reason: str | None,
    ) -> None:
        """The span of one settled attempt, from the request's arrival to now."""
        now_ns, timing = time.time_ns(), request[TIMING]
        start_ns = now_ns - int((time.perf_counter() - timing.start) * 1e9)
        carrier = {k.lower(): v for k, v in request.headers.items() if k.lower() == "traceparent"}
        parent = self._propagator.extract(carrier) if carrier else None
        operation = OPERATION.get(request.path, "chat")
        span = self._tracer.start_span(
            f"{operation} {ctx.model}",
            context=parent,
            kind=self._client,
            start_time=start_ns,
            attributes=_attributes(request, ctx, answer, judgement, status, operation),
        )
        if status >= 500 or judgement.blocked:
            span.set_attribute("error.type", reason or str(status))
            span.set_status(self._error, reason or f"status {status}")
        span.end(end_time=now_ns)

    def close(self) -> None:
        """Send what is left (blocking: call it in a thread)."""
        self.provider.shutdown()


def _attributes(
    request: web.Request,
    ctx: AuditContext,
    answer: Answer,
    judgement: Judgement,
    status: int,
    operation: str,
) -> dict[str, Any]:
    url, timing = URL(ctx.backend.url), request[TIMING]
    out: dict[str, Any] = {
        "gen_ai.operation.name": operation,
        "gen_ai.provider.name": ctx.backend.kind,
        "gen_ai.request.model": ctx.model,
        "gen_ai.response.model": ctx.model,
        "gen_ai.request.stream": request.get(BODY, {}).get("stream") is True,
        "server.address": url.host or "",
        "server.port": url.port or 0,
        "http.response.status_code": status,
        "kvfence.tenant": ctx.tenant,
        "kvfence.backend": ctx.backend.name,
        "kvfence.verdict": judgement.verdict.value,
        "kvfence.blocked": judgement.blocked,
        "kvfence.request_id": ctx.request_id,
        "kvfence.namespace": namespace_label(ctx.namespace),
    }
    if API_KEY in request:
        out["kvfence.key_id"] = request[API_KEY].id
    if answer.prompt_tokens is not None:
        out["gen_ai.usage.input_tokens"] = answer.prompt_tokens
        if answer.total_tokens is not None and answer.total_tokens >= answer.prompt_tokens:
            out["gen_ai.usage.output_tokens"] = answer.total_tokens - answer.prompt_tokens
    if answer.cached_tokens is not None:
        out["gen_ai.usage.cache_read.input_tokens"] = answer.cached_tokens
    if timing.first_event and timing.upstream_sent:
        out["gen_ai.response.time_to_first_chunk"] = timing.first_event - timing.upstream_sent
    return out


TRACES = web.AppKey("kvfence_traces", Traces)
