"""The adapter contract: one class per backend kind, registered in `kinds.ADAPTERS`.

Invariant: `inject` runs after every client-supplied cache-scoping input was removed, and it is
the only code that writes a scoping field into an upstream request.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from gateway.inputs.paths import PROXIED_PATHS
from kvfence.public import PublicPart
from kvfence.share import Share


class Adapter(ABC):
    """Scopes requests for one backend. Subclasses set `kind`, and `scoped = False` when the
    backend cannot partition its cache (the policy then needs `allow_unscoped: true`);
    `health_path` where the server says whether it is up."""

    kind: ClassVar[str]
    scoped: ClassVar[bool] = True
    # The paths this kind serves and, where they reach a cache, scopes (any other: 404 naming
    # these). vLLM's are all of them; each narrower kind lists its own.
    paths: ClassVar[frozenset[str]] = PROXIED_PATHS
    # Whether the backend can cache a prompt's leading part in a public namespace and the rest in
    # the tenant's (kvfence's handles can; a single cache salt per request cannot).
    splits_public: ClassVar[bool] = False
    # What `gateway.routing.liveness` checks: any answer below 500 means the server is up.
    health_path: ClassVar[str] = "/health"

    @abstractmethod
    def inject(self, path: str, body: dict[str, Any], headers: dict[str, str], ns: str) -> None:
        """Write namespace `ns` into the upstream body or headers for `path`."""

    def bind(
        self,
        data: bytes,
        body: dict[str, Any],
        headers: dict[str, str],
        ns: str,
        share: Share | None = None,
        public: tuple[PublicPart, ...] = (),
        ephemeral: bool = False,
    ) -> None:
        """Called after `inject` with `data`, the exact upstream body bytes (`body` encoded); an
        adapter whose scope token covers the body (kvfence's handle) writes it here, with the
        tenant's capacity `share` in the backend's pool, the request's `public` parts, and
        whether its namespace is the request's alone (`ephemeral`, scope `request`)."""
        return
