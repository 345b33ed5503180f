"""A `Policy` and its tenant registry compiled into the lookup tables requests use, plus its
namespace cache.

Invariant: built once per policy version and registry version and never mutated except the
bounded namespace cache; a reload or a registry change builds a new `Runtime`, so a key rotation
drops every cached namespace with it. A registry key authenticates only while it is neither
revoked nor past its expiry, checked on every lookup.
"""

from __future__ import annotations

import hmac
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from yarl import URL

from gateway.adapters.base import Adapter
from gateway.adapters.kinds import ADAPTERS
from gateway.adapters.kvfence import KvfenceAdapter
from gateway.inputs.paths import PROXIED_PATHS
from gateway.policy.backend_model import Backend, ModelSpec
from gateway.policy.model import Policy
from gateway.policy.registry import EMPTY, Document, KeyInfo, Registry
from gateway.policy.registry import read as read_registry
from gateway.policy.tenant_model import PublicPrefix, Scope, Tenant
from kvfence.attestation import AttestationVerifier
from kvfence.handle import HandleSigner
from kvfence.keys.apikey import is_well_formed, key_digest
from kvfence.namespace import NamespaceKey, capacity_group, derive_namespace, public_namespace
from kvfence.public import PUBLIC_GROUP
from kvfence.share import Share

NAMESPACE_CACHE_SIZE: Final = 65536


@dataclass(frozen=True, slots=True)
class Route:
    backend: Backend
    model: ModelSpec
    adapter: Adapter


def _adapter(policy: Policy, backend: Backend) -> Adapter:
    handle_key, options = policy.gateway.handle_key, backend.kvfence
    if backend.kind == KvfenceAdapter.kind and handle_key is not None and options is not None:
        signer = HandleSigner(handle_key.key, handle_key.id)
        revisions = {m.name: m.revision for m in backend.models}
        return KvfenceAdapter(signer, options.audience, revisions, policy.gateway.handle_ttl_s)
    return ADAPTERS[backend.kind]()


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a presented key is: its tenant and, for a registry key, the key's record; or why it
    opens nothing (`refused`: unknown, revoked, expired)."""

    tenant: Tenant | None
    key: KeyInfo | None = None
    refused: str = ""


_UNKNOWN: Final = Identity(None, None, "unknown")


def registry_of(policy: Policy, document: Document | None) -> Registry:
    if policy.registry is None or document is None:
        return EMPTY
    served = {m.name for b in policy.backends for m in b.models}
    digests = [d for t in policy.tenants for d in t.api_keys]
    return read_registry(document, served, policy.tenants, digests, Path(policy.source).parent)


class Runtime:
    """Lookup tables for one policy and registry: key digest -> tenant (and registry key),
    model -> routes, tenant -> models."""

    __slots__ = (
        "_cache",
        "_keys",
        "_ns_key",
        "_pepper",
        "_tenants",
        "allowed",
        "attestations",
        "policy",
        "public_prefixes",
        "public_share",
        "registry",
        "routes",
        "shares",
        "tenants",
        "upstream_urls",
    )

    def __init__(self, policy: Policy, registry: Document | None = None) -> None:
        """`registry`: the tenant registry's document (read when the policy has `registry`)."""
        self.policy = policy
        self.registry = registry_of(policy, registry)
        self.tenants = policy.tenants + self.registry.tenants
        active = policy.gateway.active_key
        self._ns_key = NamespaceKey(active.id, active.secret.value)
        self._pepper = policy.gateway.api_key_pepper.value
        self._tenants = {d: t for t in policy.tenants for d in t.api_keys}
        by_id = {t.id: t for t in self.tenants}
        self._keys = {k.digest: k for k in self.registry.keys}
        self._tenants |= {k.digest: by_id[k.tenant] for k in self.registry.keys}
        self.allowed = {t.id: frozenset(t.models) for t in self.tenants}
        adapters = {b.name: _adapter(policy, b) for b in policy.backends}
        # Backend name -> verifier of its attestations, pinned to its audience (backend id).
        self.attestations = {
            b.name: AttestationVerifier(b.kvfence.trust, b.kvfence.audience)
            for b in policy.backends
            if b.kvfence is not None
        }
        # Model -> its routes in policy order: the first backend not quarantined serves it.
        routes: dict[str, list[Route]] = {}
        for b in policy.backends:
            for m in b.models:
                routes.setdefault(m.name, []).append(Route(b, m, adapters[b.name]))
        self.routes = {name: tuple(found) for name, found in routes.items()}
        self._cache: dict[tuple[str, str, str, str], str] = {}
        even = 0.5 / max(1, len(self.tenants))  # default floors reserve half a pool in all
        self.shares = {
            t.id: Share(
                capacity_group(self._ns_key, t.id),
                t.cache.ceiling,
                min(t.cache.ceiling, even if t.cache.floor is None else t.cache.floor),
            )
            for t in self.tenants
        }
        # Model -> its declared public prefixes, longest first (the longest match wins).
        by_model: dict[str, list[PublicPrefix]] = {}
        for prefix in policy.public.prefixes:
            by_model.setdefault(prefix.model, []).append(prefix)
        self.public_prefixes = {
            model: tuple(sorted(found, key=lambda p: -p.size)) for model, found in by_model.items()
        }
        self.public_share = Share(PUBLIC_GROUP, policy.public.ceiling, policy.public.floor)
        # Backend name and path -> the parsed upstream URL (parsed once, not per request); the
        # app routes only PROXIED_PATHS here.
        self.upstream_urls = {
            (b.name, path): URL(b.url + path) for b in policy.backends for path in PROXIED_PATHS
        }

    def identify(self, key: str, now: float | None = None) -> Identity:
        """The key's tenant (and registry record), or why not. Malformed keys stop before any
        lookup; the table is keyed by a peppered HMAC, and the found entry is confirmed with a
        constant-time compare."""
        if not is_well_formed(key):
            return _UNKNOWN
        digest = key_digest(self._pepper, key)
        tenant = self._tenants.get(digest)
        if tenant is None:
            return _UNKNOWN
        info = self._keys.get(digest)
        if info is None:
            if not any(hmac.compare_digest(digest, d) for d in tenant.api_keys):
                return _UNKNOWN
            return Identity(tenant)
        if not hmac.compare_digest(digest, info.digest):
            return _UNKNOWN
        state = info.state(time.time() if now is None else now)
        return Identity(tenant, info) if state == "active" else Identity(None, info, state)

    def tenant_for_key(self, key: str) -> Tenant | None:
        """The key's tenant, or None (unknown, revoked or expired)."""
        return self.identify(key).tenant

    def namespace(self, tenant: Tenant, scope_value: str, route: Route) -> str:
        if tenant.scope is Scope.REQUEST:  # a fresh value each time: nothing worth keeping
            return derive_namespace(
                self._ns_key, tenant.id, tenant.scope.value, scope_value,
                route.model.name, route.model.revision,
            )  # fmt: skip
        cache_key = (tenant.id, scope_value, route.model.name, route.model.revision)
        ns = self._cache.get(cache_key)
        if ns is None:
            ns = derive_namespace(
                self._ns_key,
                tenant.id,
                tenant.scope.value,
                scope_value,
                route.model.name,
                route.model.revision,
            )
            if len(self._cache) >= NAMESPACE_CACHE_SIZE:
                self._cache.pop(next(iter(self._cache)))
            self._cache[cache_key] = ns
        return ns

    def public_namespace(self, route: Route, tenant: Tenant | None = None) -> str:
        """The public namespace of the route's model: the declared prefixes' one, or with
        `tenant`, that tenant's own (for the messages it marks public)."""
        cache_key = ("\x00public", tenant.id if tenant else "", route.model.name,
                     route.model.revision)  # fmt: skip
        ns = self._cache.get(cache_key)
        if ns is None:
            ns = public_namespace(
                self._ns_key, route.model.name, route.model.revision, tenant.id if tenant else ""
            )
            if len(self._cache) >= NAMESPACE_CACHE_SIZE:
                self._cache.pop(next(iter(self._cache)))
            self._cache[cache_key] = ns
        return ns
