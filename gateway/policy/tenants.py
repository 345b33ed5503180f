"""Reading the policy's `tenants` list.

Invariant: tenant ids and API key digests are unique, every tenant model is served, and no
tenant's scope header is one the gateway reserves for cache scoping.
"""

from __future__ import annotations

import re
from functools import partial
from pathlib import Path

import orjson
import yaml

from gateway.inputs.scoping import is_scoping_header
from gateway.policy.node import Node, PolicyError, compose, guarded, optional, unique_items
from gateway.policy.public import read_tenant_public
from gateway.policy.receipts import read_tenant_receipts
from gateway.policy.sources import note
from gateway.policy.tenant_model import Scope, Tenant, TenantBudgets, TenantCache, TenantLimits
from kvfence.keys.apikey import TENANT_ID_RE, is_digest

_F = frozenset
_TENANT_REQ = _F({"id", "api_keys", "scope", "models"})
_TENANT_OPT = _F({"scope_header", "limits", "cache", "public", "budgets", "receipts"})
# a registry tenant's own fields beside the policy's
_BOOKKEEPING = _F({"added", "added_by", "changed", "changed_by"})
_HEADER_RE = re.compile(r"^[A-Za-z0-9-]{1,64}$")


def _key_digests(node: Node, base: Path) -> list[tuple[Node, str]]:
    """An `api_keys` entry: a digest, or `{file: PATH}` naming a file of digests, one a line."""
    if not isinstance(node.node, yaml.MappingNode):
        return [(node, node.text())]
    name = node.mapping(_F({"file"}), _F())["file"].text()
    note(base / name)  # the watcher reloads when it appears or changes
    try:
        lines = (base / name).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        node.fail(f"cannot read key digest file {name}: {exc.strerror}")
    return [(node, line.strip()) for line in lines if line.strip() and not line.startswith("#")]


def _tenant(
    item: Node, served: set[str], unread: set[str], digests: set[str], base: Path
) -> Tenant:
    f = item.mapping(_TENANT_REQ, _TENANT_OPT)
    scope = Scope(f["scope"].choice(tuple(s.value for s in Scope)))
    keys = []
    for entry in f["api_keys"].items():
        for key_node, digest in _key_digests(entry, base):
            if not is_digest(digest):
                key_node.fail("must be a digest printed by `kvfence keys new` (hmac-sha256:<hex>)")
            if digest in digests:
                key_node.fail("duplicate API key digest")
            digests.add(digest)
            keys.append(digest)
    models = []
    for model_node in f["models"].items():
        name = model_node.text()
        if name not in served and name not in unread:
            model_node.fail(f"no backend serves model {name}")
        models.append(name)
    return Tenant(
        f["id"].text(TENANT_ID_RE, "of [A-Za-z0-9._-], at most 64"),
        tuple(keys),
        scope,
        tuple(models),
        **optional(
            f,
            scope_header=lambda n: _scope_header(n, scope),
            limits=_limits,
            cache=_cache,
            budgets=read_budgets,
        ),
        public=read_tenant_public(f.get("public"), scope),
        receipts=read_tenant_receipts(f.get("receipts")),
    )


def _scope_header(node: Node, scope: Scope) -> str:
    header = node.text(_HEADER_RE, "naming an HTTP header").lower()
    if is_scoping_header(header):
        node.fail("names a header the gateway reserves for cache scoping")
    if scope is Scope.REQUEST:
        node.fail("scope request takes no scope header")
    return header


def _cache(node: Node) -> TenantCache:
    f = node.mapping(_F(), _F({"ceiling", "floor"}))
    cache = TenantCache(
        **optional(f, ceiling=lambda n: n.number(0.01, 1.0), floor=lambda n: n.number(0.0, 1.0))
    )
    if cache.floor is not None and cache.floor > cache.ceiling:
        f["floor"].fail(f"must not exceed the ceiling ({cache.ceiling:g})")
    return cache


def _limits(node: Node) -> TenantLimits:
    f = node.mapping(_F(), _F({"requests_per_s", "burst", "concurrent", "tokens_per_min"}))
    return TenantLimits(
        **optional(
            f,
            requests_per_s=lambda n: n.number(0, 1e6),
            burst=lambda n: n.number(1, 1e7),
            concurrent=lambda n: n.integer(0, 1 << 20),
            tokens_per_min=lambda n: n.integer(0, 1 << 40),
        )
    )


def read_budgets(node: Node) -> TenantBudgets:
    f = node.mapping(_F(), _F({"hour", "day", "month"}))
    per = {k: (lambda n: n.integer(1, 1 << 50)) for k in ("hour", "day", "month")}
    return TenantBudgets(**optional(f, **per))


def read_registry_tenant(tid: str, record: object, served: set[str], base: Path) -> Tenant:
    """A registry tenant: its record is the policy's tenant mapping without `api_keys` (its keys
    are the registry's), read by the same reader. PolicyError lists what is wrong with it."""
    source = f"registry tenant {tid}"
    if not isinstance(record, dict):
        raise PolicyError([f"{source}:1: (top level): must be a mapping"])
    fields = {k: v for k, v in record.items() if k not in _BOOKKEEPING}
    node = compose(orjson.dumps({**fields, "id": tid, "api_keys": []}).decode(), source)
    tenant = guarded(lambda: _tenant(node, served, set(), set(), base))
    if tenant is None or node.errors.lines:  # an unknown key is recorded without a bail
        raise PolicyError(node.errors.lines)
    return tenant


def read_tenants(
    node: Node, served: set[str], base: Path, unread: set[str] | None = None
) -> tuple[Tenant, ...]:
    """`unread`: models of backends that failed to load (their error is already reported)."""
    digests: set[str] = set()
    read = partial(_tenant, served=served, unread=unread or set(), digests=digests, base=base)
    return unique_items(node, read, lambda t: t.id, "tenant id")
