"""Reading the policy's `backends` and `tenants` lists, with their cross-checks.

Invariant: model names are unique across backends, tenant ids and key digests are unique, and
every tenant model is served; a backend that cannot scope its cache needs `allow_unscoped`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import TypeVar

import yaml

from gateway.adapters.registry import ADAPTERS
from gateway.policy import AuditMode, Backend, KvfenceOptions, ModelSpec, Scope, Tenant
from gateway.policy_audit import read_trust
from gateway.policy_secrets import resolve
from gateway.policy_yaml import Node, guarded
from gateway.sanitize import is_scoping_header
from kvfence.apikey import is_digest

T = TypeVar("T")

_F = frozenset
_BACKEND_REQ = _F({"name", "kind", "url", "models"})
_BACKEND_OPT = _F({"allow_unscoped", "api_key", "audience", "audit", "attestation_keys"})
_KVFENCE_ONLY = _F({"audience", "audit", "attestation_keys"})
_TENANT_REQ = _F({"id", "api_keys", "scope", "models"})
_NAME_RE = re.compile(r"^[A-Za-z0-9._:/-]{1,128}$")
_TENANT_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_URL_RE = re.compile(r"^https?://[^\s/?#]+/?$")
_HEADER_RE = re.compile(r"^[A-Za-z0-9-]{1,64}$")


def _models(node: Node, seen: set[str]) -> tuple[ModelSpec, ...]:
    out: list[ModelSpec] = []
    for item in node.items():
        f = item.mapping(_F({"name", "revision"}), _F())
        name = f["name"].text(_NAME_RE)
        if name in seen:
            f["name"].fail(f"model {name} is already served by another entry")
        seen.add(name)
        out.append(ModelSpec(name, f["revision"].version_text()))
    return tuple(out)


def _kvfence(f: dict[str, Node], base: Path) -> KvfenceOptions:
    for key in ("audience", "attestation_keys"):
        if key not in f:
            f["kind"].fail(f"kind kvfence needs {key}")
    audit = AuditMode(f["audit"].choice(("enforce", "monitor"))) if "audit" in f else None
    ref, trust = read_trust(f["attestation_keys"], base)
    return KvfenceOptions(
        audience=f["audience"].text(),
        attestation_keys=ref,
        trust=trust,
        audit=audit or AuditMode.ENFORCE,
    )


def _backend(item: Node, env: Mapping[str, str], base: Path, seen: set[str]) -> Backend:
    f = item.mapping(_BACKEND_REQ, _BACKEND_OPT)
    kind = f["kind"].choice(tuple(ADAPTERS))
    for key in _KVFENCE_ONLY & f.keys():
        if kind != "kvfence":
            f[key].fail("only a backend of kind kvfence takes this key")
    allow_unscoped = f["allow_unscoped"].boolean() if "allow_unscoped" in f else False
    if not ADAPTERS[kind].scoped and not allow_unscoped:
        f["kind"].fail(f"kind {kind} cannot scope its prefix cache; set allow_unscoped: true")
    return Backend(
        name=f["name"].text(_NAME_RE),
        kind=kind,
        url=f["url"].text(_URL_RE, "like http://host:port").rstrip("/"),
        models=_models(f["models"], seen),
        allow_unscoped=allow_unscoped,
        api_key=resolve(f["api_key"], env, base, 1) if "api_key" in f else None,
        kvfence=_kvfence(f, base) if kind == "kvfence" else None,
    )


def _unique_items(
    node: Node, read: Callable[[Node], T], name_of: Callable[[T], str], what: str
) -> tuple[T, ...]:
    """Each list item read on its own (one bad item does not hide the others' errors); a
    repeated name is an error at the repeating item."""
    out: list[T] = []

    def one(item: Node) -> T:
        value = read(item)
        if any(name_of(v) == name_of(value) for v in out):
            item.fail(f"duplicate {what} {name_of(value)}")
        return value

    for item in guarded(node.items) or []:
        value = guarded(partial(one, item))
        if value is not None:
            out.append(value)
    return tuple(out)


def read_backends(node: Node, env: Mapping[str, str], base: Path) -> tuple[Backend, ...]:
    seen_models: set[str] = set()
    read = partial(_backend, env=env, base=base, seen=seen_models)
    return _unique_items(node, read, lambda b: b.name, "backend name")


def _key_digests(node: Node, base: Path) -> list[tuple[Node, str]]:
    """An `api_keys` entry: a digest, or `{file: PATH}` naming a file of digests, one a line."""
    if not isinstance(node.node, yaml.MappingNode):
        return [(node, node.text())]
    name = node.mapping(_F({"file"}), _F())["file"].text()
    try:
        lines = (base / name).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        node.fail(f"cannot read key digest file {name}: {exc.strerror}")
    return [(node, line.strip()) for line in lines if line.strip() and not line.startswith("#")]


def _tenant(item: Node, served: set[str], digests: set[str], base: Path) -> Tenant:
    f = item.mapping(_TENANT_REQ, _F({"scope_header"}))
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
        if name not in served:
            model_node.fail(f"no backend serves model {name}")
        models.append(name)
    header = None
    if "scope_header" in f:
        header = f["scope_header"].text(_HEADER_RE, "naming an HTTP header").lower()
        if is_scoping_header(header):
            f["scope_header"].fail("names a header the gateway reserves for cache scoping")
    return Tenant(f["id"].text(_TENANT_RE), tuple(keys), scope, tuple(models), header)


def read_tenants(node: Node, served: set[str], base: Path) -> tuple[Tenant, ...]:
    digests: set[str] = set()
    read = partial(_tenant, served=served, digests=digests, base=base)
    return _unique_items(node, read, lambda t: t.id, "tenant id")
