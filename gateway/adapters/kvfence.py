"""kvfence's own backend: the namespace travels in a signed, expiring handle, never in clear.

Invariant: every upstream request carries a fresh handle bound to one upstream request id, the
namespace, the model and revision, the backend's audience and the digest of the exact body sent;
the id is unique per request even when a client repeats its `x-request-id`, so a handle is never
refused as a replay by accident.
"""

from __future__ import annotations

import secrets
from typing import Any

from gateway.adapters.base import CHAT, COMPLETIONS, Adapter
from gateway.errors import NotSupported
from gateway.policy.model import Backend
from kvfence.handle import HANDLE_HEADER, HandleSigner
from kvfence.public import PublicPart
from kvfence.share import Share

UPSTREAM_ID_HEADER = "x-request-id"


class KvfenceAdapter(Adapter):
    kind = "kvfence"
    paths = frozenset({CHAT, COMPLETIONS})
    splits_public = True
    health_path = "/readyz"  # 503 while the model loads

    def __init__(
        self, backend: Backend, signer: HandleSigner | None = None, ttl_s: float = 60.0
    ) -> None:
        super().__init__(backend)
        self.signer = signer
        self.ttl_s = ttl_s
        self._revisions = {m.name: m.revision for m in backend.models}

    def inject(self, path: str, body: dict[str, Any], headers: dict[str, str], ns: str) -> None:
        if self.signer is None or self.backend.kvfence is None:
            raise NotSupported("this gateway has no handle key for kvfence backends")
        headers[UPSTREAM_ID_HEADER] = f"{headers[UPSTREAM_ID_HEADER]}.{secrets.token_hex(6)}"

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
        options = self.backend.kvfence
        assert self.signer is not None and options is not None  # inject refused otherwise
        model = body["model"]
        headers[HANDLE_HEADER] = self.signer.sign(
            ns,
            model,
            self._revisions[model],
            headers[UPSTREAM_ID_HEADER],
            options.audience,
            self.ttl_s,
            body=data,
            share=share,
            public=public,
            ephemeral=ephemeral,
        )
