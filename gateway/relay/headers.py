"""The upstream headers a relayed stream keeps: its `Content-Type` as the backend sent it
(parameters such as `charset` included), set as the stream's headers are sent (a plain
answer's relay sets it itself).

Invariant: only an answer the relay built from the upstream's (same media type) takes the
upstream's header; a local answer (an error the gateway sends instead) keeps its own.
"""

from __future__ import annotations

from aiohttp import web

from gateway.relay.client import Answer

UPSTREAM_CONTENT_TYPE = web.RequestKey("kvfence_upstream_content_type", str)


def remember(request: web.Request, upstream: Answer) -> None:
    """Keep the upstream's `Content-Type` for the stream the relay is about to begin."""
    value = upstream.headers.get("content-type")
    if value:
        request[UPSTREAM_CONTENT_TYPE] = value


async def keep_content_type(request: web.Request, response: web.StreamResponse) -> None:
    """`on_response_prepare`: a relayed stream goes out with the upstream's `Content-Type`."""
    value = request.get(UPSTREAM_CONTENT_TYPE)
    if value is None:
        return
    if value.split(";", 1)[0].strip().lower() == response.content_type.lower():
        response.headers["content-type"] = value
