"""Whether a client asked to see usage in its stream (`stream_options.include_usage`), and the
stream options sent upstream, where the gateway asks for usage for its own accounting.

Invariant: read from the body as the client sent it, before the gateway asks for usage; a client
that did not ask gets the stream it would get direct: no usage, at the end or in a chunk
(`gateway.audit.answer.usage`).
"""

from __future__ import annotations

from typing import Any


def usage_asked(body: dict[str, Any]) -> bool:
    """A streamed chat/completions request asked for usage, as the client sent it."""
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def ask_for_usage(body: dict[str, Any]) -> None:
    """Make a stream end with a usage chunk. vLLM reads `continuous_usage_stats` only with
    `include_usage`, so for a client that did not ask it is not sent on: the gateway's own
    `include_usage` would turn it on."""
    options = body.get("stream_options")
    if not isinstance(options, dict):
        options = body["stream_options"] = {}
    elif options.get("include_usage") is not True:
        options.pop("continuous_usage_stats", None)
    options["include_usage"] = True
