"""Where a canary round sends and how: the backend's URL for the shape's path, each arm's
reserved canary namespace injected by the backend's own adapter (exactly as for a tenant), and
the marker key its prompts are minted under.

Invariant: every arm of every round has its own namespace (derived in the canary domain from
the round's id), so no tenant request and no other arm can share its cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp

from gateway.adapters.base import Adapter
from gateway.policy.backend_model import Backend, ModelSpec
from gateway.verify.markers import MarkerKey
from gateway.verify.sends import Sent, send
from gateway.verify.shapes import Shape
from kvfence.namespace import NamespaceKey, canary_namespace
from kvfence.probe.client import Identity

# One common word per letter of the probe's random letters (one token each in the usual BPE
# vocabularies, seven bytes with its space): a canary prompt is about as long in bytes as a
# tenant's prompt of as many tokens, so a layer that keys on body size sees the same size.
WORDS: Final = (
    "action", "animal", "answer", "appear", "basket", "battle", "beauty", "border", "bottle",
    "branch", "breath", "bridge", "bright", "broken", "button", "camera", "candle", "carbon",
    "castle", "center", "chance", "change", "charge", "choice", "church", "circle",
)  # fmt: skip


def canary_text(marker: str, letters: Sequence[str]) -> str:
    """A canary prompt: its live marker, then a word for each random letter."""
    return marker + " " + " ".join(WORDS[ord(c) - 97] for c in letters)


def identity(adapter: Adapter, backend: Backend, path: str, namespace: str, name: str) -> Identity:
    """The canary's credential: the namespace injected exactly as for a tenant's request."""
    body: dict[str, Any] = {}
    headers: dict[str, str] = {}
    adapter.inject(path, body, headers, namespace)
    key = backend.api_key.value.decode() if backend.api_key is not None else None
    return Identity(name, key, tuple(headers.items()), tuple(body.items()))


@dataclass(frozen=True, slots=True)
class Target:
    """Where a round sends, and how it scopes and marks its prompts."""

    session: aiohttp.ClientSession
    adapter: Adapter
    backend: Backend
    model: ModelSpec
    key: NamespaceKey
    markers: MarkerKey
    timeout_s: float
    sent: list[int] = field(default_factory=lambda: [0])  # sends so far, failed ones included

    def identity(self, shape: Shape, round_id: str, arm: str) -> Identity:
        ns = canary_namespace(self.key, self.backend.name, self.model.name, arm, round_id)
        return identity(self.adapter, self.backend, shape.path, ns, arm[0].upper())

    async def send(self, shape: Shape, who: Identity, text: str) -> Sent:
        self.sent[0] += 1
        url = self.backend.url.rstrip("/") + shape.path
        return await send(self.session, url, who, shape.body(self.model.name, text), self.timeout_s)
