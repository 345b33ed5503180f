"""Reading the policy's `backends` list.

Invariant: model names are unique across backends and backend names are unique; a backend that
cannot scope its cache needs `allow_unscoped: true`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import partial
from pathlib import Path

from gateway.adapters.registry import ADAPTERS
from gateway.filters.fields import extra_field_problem
from gateway.policy.keys import read_trust
from gateway.policy.model import AuditMode, Backend, KvfenceOptions, ModelSpec
from gateway.policy.node import Node, unique_items
from gateway.policy.secrets import resolve

_F = frozenset
_BACKEND_REQ = _F({"name", "kind", "url", "models"})
_BACKEND_OPT = _F(
    {"allow_unscoped", "api_key", "audience", "audit", "attestation_keys", "extra_fields"}
)
_KVFENCE_ONLY = _F({"audience", "audit", "attestation_keys"})
_NAME_RE = re.compile(r"^[A-Za-z0-9._:/-]{1,128}$")
_URL_RE = re.compile(r"^https?://[^\s/?#]+/?$")


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


def _extra_fields(node: Node, kind: str) -> frozenset[str]:
    names: set[str] = set()
    for item in node.items():
        name = item.text()
        problem = extra_field_problem(kind, name)
        if problem is not None:
            item.fail(problem)
        names.add(name)
    return frozenset(names)


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
    extra = _extra_fields(f["extra_fields"], kind) if "extra_fields" in f else frozenset()
    return Backend(
        name=f["name"].text(_NAME_RE),
        kind=kind,
        url=f["url"].text(_URL_RE, "like http://host:port").rstrip("/"),
        models=_models(f["models"], seen),
        allow_unscoped=allow_unscoped,
        api_key=resolve(f["api_key"], env, base, 1) if "api_key" in f else None,
        kvfence=_kvfence(f, base) if kind == "kvfence" else None,
        extra_fields=extra,
    )


def read_backends(node: Node, env: Mapping[str, str], base: Path) -> tuple[Backend, ...]:
    seen_models: set[str] = set()
    read = partial(_backend, env=env, base=base, seen=seen_models)
    return unique_items(node, read, lambda b: b.name, "backend name")
