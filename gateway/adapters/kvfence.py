"""kvfence's own backend: the namespace travels in a signed, expiring handle, never in clear.

Invariant: every upstream request carries a fresh handle bound to one upstream request id, the
namespace, the model and revision, the backend's audience and the digest of the exact body sent;
the id is the gateway's own, fresh for each attempt (never the client's `x-request-id`), so a
handle is never refused as a replay by accident.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.adapters.base import Adapter
from gateway.errors import NotSupported
from gateway.inputs.paths import CHAT, COMPLETIONS
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
        self,
        signer: HandleSigner | None = None,
        audience: str = "",
        revisions: Mapping[str, str] | None = None,
        ttl_s: float = 60.0,
    ) -> None:
        """`audience`: the backend's id its handles name; `revisions`: model -> revision."""
        self.signer = signer
        self.audience = audience
        self.ttl_s = ttl_s
        self._revisions = dict(revisions or {})

    def inject(self, path: str, body: dict[str, Any], headers: dict[str, str], ns: str) -> None:
        if self.signer is None or not self.audience:
            raise NotSupported("this gateway has no handle key for kvfence backends")

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
        assert self.signer is not None  # inject refused otherwise
        model = body["model"]
        headers[HANDLE_HEADER] = self.signer.sign(
            ns,
            model,
            self._revisions[model],
            headers[UPSTREAM_ID_HEADER],
            self.audience,
            self.ttl_s,
            body=data,
            share=share,
            public=public,
            ephemeral=ephemeral,
        )
