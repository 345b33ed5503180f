"""What usage a client asked to see in its stream (`stream_options`), read before the gateway
forces `include_usage` upstream for its own accounting.

Invariant: read from the body as the client sent it; `EVERYTHING` for any answer the gateway
asked nothing extra for (a plain answer, a Responses stream, a client that asked itself).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final


@dataclass(frozen=True, slots=True)
class UsageAsked:
    """`end`: the client gets the usage-only event that ends a chat/completions stream;
    `chunks`: it gets the `usage` objects of chunks that carry choices (vLLM's
    `continuous_usage_stats`, which only the gateway's `include_usage` would turn on)."""

    end: bool
    chunks: bool


EVERYTHING: Final = UsageAsked(end=True, chunks=True)


def usage_asked(body: dict[str, Any]) -> UsageAsked:
    """A streamed chat/completions request's `stream_options` as the client sent them."""
    options = body.get("stream_options")
    if not isinstance(options, dict):
        return UsageAsked(end=False, chunks=True)
    if options.get("include_usage") is True:
        return EVERYTHING
    # Without `include_usage` the backend sends no per-chunk usage, whatever else was asked.
    return UsageAsked(end=False, chunks=options.get("continuous_usage_stats") is not True)
