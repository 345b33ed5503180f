"""A fake OpenTelemetry collector (a real aiohttp app on port 0) that takes OTLP/HTTP protobuf
trace exports at `/v1/traces`, as the OpenTelemetry Collector does, and keeps every span."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class CollectedSpan:
    name: str
    kind: int
    trace_id: str
    parent_span_id: str
    service: str
    attributes: dict[str, Any]
    status_code: int


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


@dataclass
class FakeCollector:
    spans: list[CollectedSpan] = field(default_factory=list)
    exports: int = 0
    url: str = ""
    _runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _traces(self, request: web.Request) -> web.Response:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        assert request.content_type == "application/x-protobuf"
        export = ExportTraceServiceRequest()
        export.ParseFromString(await request.read())
        self.exports += 1
        for resource_spans in export.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    self.spans.append(
                        CollectedSpan(
                            span.name,
                            span.kind,
                            span.trace_id.hex(),
                            span.parent_span_id.hex(),
                            str(resource.get("service.name")),
                            {a.key: _value(a.value) for a in span.attributes},
                            span.status.code,
                        )
                    )
        body = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")
