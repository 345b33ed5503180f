"""What the admin listener and the offline CLI both do with the registry: build a new or changed
tenant's record (checked by the policy's tenant reader before it is stored), and list tenants
(with their spend, where known) and keys (the policy file's and the registry's together).

Invariant: a record is stored only after it reads as a valid tenant against the policy in
force; a listing never shows a key or a digest, only key ids.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gateway.policy.model import Policy
from gateway.policy.node import PolicyError
from gateway.policy.registry import Document, KeyInfo, Registry, RegistryError, key_id
from gateway.policy.tenant_model import Scope, Tenant
from gateway.policy.tenants import read_registry_tenant

PERIODS = ("hour", "day", "month")


def served(policy: Policy) -> list[str]:
    return sorted({m.name for b in policy.backends for m in b.models})


def tenant_record(policy: Policy, spec: Mapping[str, Any]) -> Document:
    """A registry tenant from `spec` (id, and optionally scope, models, scope_header, limits,
    budgets, added_by), with the defaults filled in: scope `tenant`, every model the policy
    serves. RegistryError lists what the policy's tenant reader refuses."""
    if not isinstance(spec.get("id"), str):
        raise RegistryError("a tenant needs an id")
    record: Document = {
        "scope": spec.get("scope") or Scope.TENANT.value,
        "models": list(spec.get("models") or served(policy)),
    }
    for name in ("scope_header", "limits", "budgets", "added_by"):
        if spec.get(name):
            record[name] = spec[name]
    check_record(policy, spec["id"], record)
    return {"id": spec["id"], **record}


def check_record(policy: Policy, tid: str, record: Document) -> Tenant:
    """`record` read as registry tenant `tid` against `policy`, or RegistryError with what the
    policy's tenant reader refuses, in one line."""
    try:
        return read_registry_tenant(tid, record, set(served(policy)), Path(policy.source).parent)
    except PolicyError as exc:
        raise RegistryError("; ".join(e.split(": ", 1)[-1] for e in exc.errors)) from None


def _tenant_json(tenant: Tenant, source: str, keys: int, added: Any = None) -> Document:
    out: Document = {
        "id": tenant.id,
        "source": source,
        "scope": tenant.scope.value,
        "models": list(tenant.models),
        "active_keys": keys,
    }
    budgets = {p: getattr(tenant.budgets, p) for p in PERIODS if getattr(tenant.budgets, p)}
    if budgets:
        out["budgets"] = budgets
    if added is not None:
        out["added"] = added
    return out


def tenants_view(
    policy: Policy,
    registry: Registry,
    doc: Document,
    now: float,
    spend: Mapping[str, Mapping[str, int]] | None = None,
) -> Document:
    """Every tenant with its active keys; with `spend` (tenant id -> tokens spent in the
    current hour, day and month), each tenant that has an entry in it gets `spent`."""
    active: dict[str, int] = {}
    for key in registry.keys:
        if key.state(now) == "active":
            active[key.tenant] = active.get(key.tenant, 0) + 1
    rows = [
        _tenant_json(t, "policy", len(t.api_keys) + active.get(t.id, 0)) for t in policy.tenants
    ]
    for tenant in registry.tenants:
        record = doc["tenants"].get(tenant.id, {})
        row = _tenant_json(tenant, "registry", active.get(tenant.id, 0), record.get("added"))
        for name in ("added_by", "changed", "changed_by"):
            if record.get(name):
                row[name] = record[name]
        rows.append(row)
    for row in rows:
        if spend is not None and row["id"] in spend:
            row["spent"] = {p: int(spend[row["id"]].get(p, 0)) for p in PERIODS}
    return {"version": registry.version, "tenants": rows, "problems": list(registry.problems)}


def spent_text(row: Mapping[str, Any]) -> str:
    """A listed tenant's spend against its budgets (`day=1234/100000`), `-` when its spend is
    not known or it has no budget."""
    spent, budgets = row.get("spent"), row.get("budgets") or {}
    if spent is None or not budgets:
        return "-"
    return ",".join(f"{p}={spent.get(p, 0)}/{budgets[p]}" for p in PERIODS if p in budgets)


def _key_json(key: KeyInfo, now: float) -> Document:
    out: Document = {
        "id": key.id,
        "tenant": key.tenant,
        "label": key.label,
        "source": "registry",
        "created": key.created,
        "expires": key.expires,
        "revoked": key.revoked,
        "state": key.state(now),
    }
    budgets = {p: getattr(key.budgets, p) for p in PERIODS if getattr(key.budgets, p)}
    if budgets:
        out["budgets"] = budgets
    return out


def keys_view(policy: Policy, registry: Registry, tenant: str | None, now: float) -> list[Document]:
    """Every key of `tenant` (None: of every tenant), the policy file's digests as keys without
    a label or times."""
    rows = [
        {"id": key_id(d), "tenant": t.id, "label": "", "source": "policy", "created": None,
         "expires": None, "revoked": None, "state": "active"}
        for t in policy.tenants if tenant in (None, t.id) for d in t.api_keys
    ]  # fmt: skip
    rows += [_key_json(k, now) for k in registry.keys if tenant in (None, k.tenant)]
    return rows


def tenant_ids(policy: Policy, doc: Document) -> set[str]:
    return {t.id for t in policy.tenants} | set(doc["tenants"])


def parse_budgets(items: Sequence[str], removable: bool = False) -> dict[str, int]:
    """`PERIOD=TOKENS` options (`day=1000000`) as a budgets mapping (`removable`: `day=0` too,
    which removes that budget)."""
    out: dict[str, int] = {}
    for item in items:
        period, _, amount = item.partition("=")
        if period not in PERIODS or not amount.isdigit() or int(amount) < (0 if removable else 1):
            raise RegistryError(
                f"--budget {item}: use PERIOD=TOKENS, PERIOD one of hour, day, month"
            )
        out[period] = int(amount)
    return out


def parse_limits(items: Sequence[str]) -> dict[str, float]:
    """`NAME=VALUE` options (`requests_per_s=5`) as a limits mapping (the policy reader checks
    names and ranges)."""
    out: dict[str, float] = {}
    for item in items:
        name, _, value = item.partition("=")
        try:
            number = float(value)
        except ValueError:
            raise RegistryError(f"--limit {item}: use NAME=NUMBER (docs/policy.md)") from None
        out[name] = int(number) if number.is_integer() else number
    return out


def parse_expiry(text: str | None, now: float | None = None) -> float | None:
    """`30d`, `12h`, `90m`, `45s`, `now` (from now), or seconds since the epoch."""
    if not text:
        return None
    now = time.time() if now is None else now
    if text == "now":
        return now
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if text[-1] in units and text[:-1].replace(".", "", 1).isdigit():
        return now + float(text[:-1]) * units[text[-1]]
    if text.replace(".", "", 1).isdigit() and float(text) > 1e9:
        return float(text)
    raise RegistryError(f"expiry {text!r}: use 30d, 12h, 90m, 45s, now, or seconds since the epoch")
