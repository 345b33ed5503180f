"""Reading the policy's `backends` list.

Invariant: model names are unique across backends and backend names are unique; a backend that
cannot scope its cache needs `allow_unscoped: true`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import partial
from pathlib import Path

import yaml

from gateway.adapters.kinds import ADAPTERS
from gateway.inputs.kinds import extra_field_problem
from gateway.policy.backend_model import (
    AuditMode,
    Backend,
    KvfenceOptions,
    ModelSpec,
    VerifySettings,
)
from gateway.policy.keys import read_trust
from gateway.policy.node import Node, optional, unique_items
from gateway.policy.secrets import resolve
from gateway.policy.verify import read_verify

_F = frozenset
_BACKEND_REQ = _F({"name", "kind", "url", "models"})
_BACKEND_OPT = _F(
    {"allow_unscoped", "api_key", "audience", "audit", "attestation_keys", "extra_fields"}
    | {"verify", "required", "weight"}
)
_KVFENCE_ONLY = _F({"audience", "attestation_keys"})
_VERIFIABLE = _F({"vllm", "sglang", "trtllm", "dynamo", "max"})  # scoped kinds that do not attest
_NAME_RE = re.compile(r"^[A-Za-z0-9._:/-]{1,128}$")
_URL_RE = re.compile(r"^https?://[^\s/?#]+/?$")


def _models(node: Node, scoped: bool, seen: dict[str, tuple[str, bool]]) -> tuple[ModelSpec, ...]:
    """A model may be served by several backends (affinity routing and failover) if they agree
    on its revision and are all scoped or all unscoped, so a failover never lands on an
    unscoped backend."""
    out: list[ModelSpec] = []
    for item in node.items():
        f = item.mapping(_F({"name", "revision"}), _F())
        name, revision = f["name"].text(_NAME_RE), f["revision"].version_text()
        if any(m.name == name for m in out):
            f["name"].fail(f"model {name} is listed twice for this backend")
        if name in seen and seen[name][1] != scoped:
            f["name"].fail(
                f"model {name} is served by both a scoped and an unscoped backend; a model's "
                "backends must all scope their cache or all be allow_unscoped"
            )
        if name in seen and seen[name][0] != revision:
            f["name"].fail(
                f"model {name} is served elsewhere with another revision; "
                "backends of one model must agree on it"
            )
        seen[name] = (revision, scoped)
        out.append(ModelSpec(name, revision))
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
    ref, trust = read_trust(f["attestation_keys"], base)
    return KvfenceOptions(audience=f["audience"].text(), attestation_keys=ref, trust=trust)


def _verify(f: dict[str, Node], kind: str, base: Path) -> VerifySettings | None:
    if kind not in _VERIFIABLE:
        if "verify" in f:
            f["verify"].fail(f"kind {kind} takes no verify settings (only {sorted(_VERIFIABLE)})")
        return None
    return read_verify(f["verify"], base) if "verify" in f else VerifySettings()  # scoped kinds


def _backend(
    item: Node, env: Mapping[str, str], base: Path, seen: dict[str, tuple[str, bool]]
) -> Backend:
    f = item.mapping(_BACKEND_REQ, _BACKEND_OPT)
    kind = f["kind"].choice(tuple(ADAPTERS))
    for key in _KVFENCE_ONLY & f.keys():
        if kind != "kvfence":
            f[key].fail("only a backend of kind kvfence takes this key")
    scoping = optional(f, allow_unscoped=Node.boolean)
    if not ADAPTERS[kind].scoped and not scoping.get("allow_unscoped"):
        f["kind"].fail(f"kind {kind} cannot scope its prefix cache; set allow_unscoped: true")
    extra = optional(f, extra_fields=lambda n: _extra_fields(n, kind))
    name = f["name"].text(_NAME_RE)
    url = f["url"].text(_URL_RE, "like http://host:port").rstrip("/")
    models = _models(f["models"], ADAPTERS[kind].scoped, seen)
    api_key = optional(f, api_key=lambda n: resolve(n, env, base, 1))
    kvfence = _kvfence(f, base) if kind == "kvfence" else None
    return Backend(
        name,
        kind,
        url,
        models,
        kvfence=kvfence,
        verify=_verify(f, kind, base),
        **scoping,
        **extra,
        **api_key,
        **optional(
            f,
            audit=lambda n: AuditMode(n.choice(tuple(AuditMode))),
            required=Node.boolean,
            weight=lambda n: n.number(0.01, 1000.0),
        ),
    )


def named_models(node: Node) -> set[str]:
    """Every model name the backends list mentions, read leniently (also from backends that
    failed to load): a tenant naming one of those gets no second, misleading error."""
    names: set[str] = set()
    items = node.node.value if isinstance(node.node, yaml.SequenceNode) else []
    for item in items:
        models = _raw_value(item, "models")
        for model in models.value if isinstance(models, yaml.SequenceNode) else []:
            name = _raw_value(model, "name")
            if isinstance(name, yaml.ScalarNode):
                names.add(str(name.value))
    return names


def _raw_value(node: yaml.Node, key: str) -> yaml.Node | None:
    if not isinstance(node, yaml.MappingNode):
        return None
    return next((v for k, v in node.value if getattr(k, "value", None) == key), None)


def read_backends(node: Node, env: Mapping[str, str], base: Path) -> tuple[Backend, ...]:
    seen_models: dict[str, tuple[str, bool]] = {}
    read = partial(_backend, env=env, base=base, seen=seen_models)
    return unique_items(node, read, lambda b: b.name, "backend name")
