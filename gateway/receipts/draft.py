"""One answer's receipt while its exchange runs: started with the request (its id, which the
answer's headers carry, and the digests of the request as received and as forwarded), fed the
exact bytes the client is sent, and completed into the signed document once the answer's record
is in its tenant's receipt log.

Invariant: the receipt's response digest covers exactly the bytes handed to the client, SSE
framing included, and `document` is built once, from the same facts the record was written
from; nothing in it is a prompt, a key or a namespace.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from gateway.audit.judge import Answer, AuditContext, Judgement, verdict_fields
from gateway.receipts.evidence import evidence
from gateway.receipts.store import new_id
from gateway.state import (
    BODY,
    PUBLIC,
    RECEIVED_BODY,
    ROUTE,
    RUNTIME,
    SCOPE_VALUE,
    TENANT,
    UPSTREAM_BODY,
)
from kvfence.namespace import namespace_label
from kvfence.public import chat_digest, text_digest
from kvfence.receipts.receipt import (
    API_VERSION,
    AUDIT_LOG,
    CACHE_SCOPE,
    FORWARDED,
    MODIFIED,
    RECEIVED,
    RETURNED,
    VERDICT,
    KeySet,
    numbered,
    sha256_tag,
)

PARTITION = "gateway-enforced"  # the gateway derives and injects the namespace; the caller cannot


@dataclass(slots=True)
class Draft:
    receipt_id: str
    served_at: int
    endpoint: str
    model: str | None  # as requested
    received: str
    forwarded: str
    scope: str
    scope_value: str | None  # its digest (None: tenant scope has no value)
    revision: str
    backend_kind: str
    prefixes: Mapping[str, str]  # public namespace -> prefix name (this request's)
    chat_id: str | None = None
    wire: Any = field(default_factory=hashlib.sha256)

    def sent(self, data: bytes) -> None:
        """Bytes handed to the client, in order."""
        self.wire.update(data)

    def replace(self, body: bytes) -> None:
        """The client gets `body` instead of anything counted so far (a local answer)."""
        self.wire = hashlib.sha256(body)

    def plain(self, body: bytes, parsed: Any) -> None:
        """A plain answer `body` (`parsed`: as JSON, None when it is not), sent whole."""
        self.replace(body)
        if isinstance(parsed, dict) and isinstance(parsed.get("id"), str):
            self.chat_id = parsed["id"]

    def document(
        self,
        ctx: AuditContext,
        answer: Answer,
        judgement: Judgement,
        status: int,
        reason: str | None,
        position: tuple[str, int, bytes],
        keyset: KeySet,
    ) -> dict[str, Any]:
        """The receipt, unsigned; `position`: its entry's log origin, index and leaf hash."""
        origin, index, leaf = position
        wire = "sha256:" + self.wire.hexdigest()
        events: list[dict[str, Any]] = [
            {"type": RECEIVED, "body_hash": self.received},
            {"type": FORWARDED, "body_hash": self.forwarded},
        ]
        if self.received != self.forwarded:
            events.append({"type": MODIFIED})
        events += [
            self._scope(ctx),
            {
                "type": VERDICT,
                **verdict_fields(answer, judgement, status, reason),
                "evidence": evidence(ctx, answer, judgement, self.prefixes),
            },
            {"type": RETURNED, "cleartext_hash": wire, "wire_hash": wire},
            {
                "type": AUDIT_LOG,
                "log": origin,
                "index": index,
                "leaf_hash": leaf.hex(),
            },
        ]
        return {
            "api_version": API_VERSION,
            "receipt_id": self.receipt_id,
            "chat_id": self.chat_id,
            "model": self.model,
            "workload_id": keyset.workload_id,
            "workload_keyset_digest": keyset.digest,
            "endpoint": self.endpoint,
            "method": "POST",
            "served_at": self.served_at,
            "event_log": numbered(events),
        }

    def _scope(self, ctx: AuditContext) -> dict[str, Any]:
        return {
            "type": CACHE_SCOPE,
            "namespace": namespace_label(ctx.namespace),
            "namespace_key_id": ctx.namespace.partition(".")[0],
            "scope": self.scope,
            "scope_value_digest": self.scope_value,
            "partition": PARTITION,
            "backend": {"name": ctx.backend.name, "kind": self.backend_kind},
            "model": {"name": ctx.model, "revision": self.revision},
        }


def _prefix_names(request: web.Request) -> dict[str, str]:
    """The names of the declared public prefixes this request matched, by public namespace."""
    parts = request.get(PUBLIC, ())
    if not parts:
        return {}
    prefixes = request[RUNTIME].public_prefixes.get(request[ROUTE].model.name, ())
    names: dict[str, str] = {}
    for part in parts:
        for prefix in prefixes:
            digest = text_digest(prefix.text) if part.messages == 0 and prefix.text else None
            if digest is None and part.messages:
                digest = chat_digest(prefix.messages)
            if digest == part.digest:
                names[part.namespace] = prefix.name
                break
    return names


def start(request: web.Request) -> Draft | None:
    """The receipt of the exchange starting now, or None (receipts off, for all or this
    tenant)."""
    settings = request[RUNTIME].policy.gateway.receipts
    tenant = request[TENANT]
    if settings is None or not tenant.receipts.enabled:
        return None
    route, body = request[ROUTE], request[BODY]
    scope_value = request.get(SCOPE_VALUE, "")
    model = body.get("model")
    return Draft(
        receipt_id=new_id(tenant.receipts.keep_s or settings.keep_s),
        served_at=int(time.time()),
        endpoint=request.path,
        model=model if isinstance(model, str) else None,
        received=sha256_tag(request.get(RECEIVED_BODY, b"")),
        forwarded=sha256_tag(request.get(UPSTREAM_BODY, b"")),
        scope=tenant.scope.value,
        scope_value=sha256_tag(scope_value.encode()) if scope_value else None,
        revision=route.model.revision,
        backend_kind=route.backend.kind,
        prefixes=_prefix_names(request),
    )
