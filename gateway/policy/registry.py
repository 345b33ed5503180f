"""The tenant registry: tenants and API keys kept as data in the control-plane database,
changed by `kvfence tenants` and `kvfence keys` without editing the policy. One JSON
document: its `version`, its tenants (each the policy's tenant mapping without `api_keys`)
and its keys (digest, tenant, label, created, expires, revoked). This module reads a document
into what a `Runtime` adds to the policy, and changes a document; the control-plane database
keeps it (`gateway.control.registry`).

Invariant: a registry tenant is read by the policy's own tenant reader, so it is checked exactly
as a policy tenant is; an entry that fails a check is left out with its reason (its keys open
nothing), never read loosely; a key is only ever stored as its digest.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from gateway.policy.node import PolicyError, compose, guarded
from gateway.policy.tenant_model import Tenant, TenantBudgets
from gateway.policy.tenants import read_budgets, read_registry_tenant
from kvfence.keys.apikey import TENANT_ID_RE, is_digest

FORMAT: Final = 1
KEY_ID_PREFIX: Final = "key_"
LABEL_MAX: Final = 64
Document = dict[str, Any]
_CHANGES: Final = frozenset(
    {"models", "scope", "scope_header", "limits", "budgets", "clear_limits", "clear_budgets",
     "changed_by"}
)  # fmt: skip


class RegistryError(Exception):
    """A change the registry refuses: one line naming the cause and the fix."""


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """One registry key as authentication reads it (never the key itself)."""

    id: str
    tenant: str
    digest: str
    label: str = ""
    created: float = 0.0
    expires: float | None = None
    revoked: float | None = None
    budgets: TenantBudgets = field(default_factory=TenantBudgets)

    def state(self, now: float) -> str:
        if self.revoked is not None:
            return "revoked"
        if self.expires is not None and self.expires <= now:
            return "expired"
        return "active"


@dataclass(frozen=True, slots=True)
class Registry:
    """A document read against one policy: its valid tenants and keys, and why any entry was
    left out (`problems`, one line each)."""

    version: int = 0
    tenants: tuple[Tenant, ...] = ()
    keys: tuple[KeyInfo, ...] = ()
    problems: tuple[str, ...] = ()
    origin: Mapping[str, str] = field(default_factory=dict)  # tenant id -> who added it


EMPTY: Final = Registry()


def empty_document() -> Document:
    return {"format": FORMAT, "version": 0, "tenants": {}, "keys": {}}


def key_id(digest: str) -> str:
    """A key's id: derived from its digest, so whoever holds the key (and the pepper) finds it."""
    return KEY_ID_PREFIX + hashlib.sha256(digest.encode()).hexdigest()[:12]


def decode(raw: bytes, source: str) -> Document:
    """A stored document, checked for its shape (RegistryError when it is not one)."""
    try:
        doc = orjson.loads(raw) if raw.strip() else empty_document()
    except orjson.JSONDecodeError as exc:
        raise RegistryError(f"{source}: not JSON ({exc})") from None
    if (
        not isinstance(doc, dict)
        or doc.get("format") != FORMAT
        or not isinstance(doc.get("version"), int)
        or not isinstance(doc.get("tenants"), dict)
        or not isinstance(doc.get("keys"), dict)
    ):
        raise RegistryError(f"{source}: not a kvfence registry (format {FORMAT})")
    return doc


def encode(doc: Document) -> bytes:
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"


def _key(kid: str, rec: Any, budgets_of: Callable[[Any, str], TenantBudgets]) -> KeyInfo:
    if not isinstance(rec, dict) or not is_digest(str(rec.get("digest", ""))):
        raise ValueError("its digest is missing or malformed")
    if key_id(rec["digest"]) != kid:
        raise ValueError("its id does not match its digest")
    times = {k: rec.get(k) for k in ("created", "expires", "revoked")}
    if any(v is not None and not isinstance(v, int | float) for v in times.values()):
        raise ValueError("created, expires and revoked must be times (seconds) or null")
    return KeyInfo(
        kid,
        str(rec.get("tenant", "")),
        rec["digest"],
        str(rec.get("label", ""))[:LABEL_MAX],
        float(times["created"] or 0.0),
        None if times["expires"] is None else float(times["expires"]),
        None if times["revoked"] is None else float(times["revoked"]),
        budgets_of(rec.get("budgets"), f"registry key {kid}"),
    )


def _budgets(value: Any, source: str) -> TenantBudgets:
    if value is None:
        return TenantBudgets()
    node = compose(orjson.dumps(value).decode(), source)
    budgets = guarded(lambda: read_budgets(node))
    if budgets is None or node.errors.lines:
        raise ValueError("; ".join(node.errors.lines))
    return budgets


def read(
    doc: Document, served: set[str], taken: Iterable[Tenant], digests: Iterable[str], base: Path
) -> Registry:
    """The document's tenants and keys for a policy serving `served`, whose own tenants are
    `taken` and own key digests `digests`: a registry tenant never shadows a policy tenant, and
    a digest opens one tenant only."""
    problems: list[str] = []
    known = {t.id for t in taken}
    seen = set(digests)
    keys: list[KeyInfo] = []
    for kid, rec in sorted(doc["keys"].items()):
        try:
            info = _key(kid, rec, _budgets)
        except (ValueError, PolicyError) as exc:
            problems.append(f"registry key {kid}: {exc}")
            continue
        if info.digest in seen:
            problems.append(f"registry key {kid}: its digest opens another tenant already")
            continue
        seen.add(info.digest)
        keys.append(info)
    tenants, origin = [], {}
    for tid, rec in sorted(doc["tenants"].items()):
        if tid in known:
            problems.append(f"registry tenant {tid}: the policy defines a tenant {tid}; it wins")
            continue
        try:
            tenant = read_registry_tenant(tid, rec, served, base)
        except PolicyError as exc:
            problems.append("; ".join(exc.errors))
            continue
        tenants.append(tenant)
        known.add(tid)
        origin[tid] = str(rec.get("added_by", "")) if isinstance(rec, dict) else ""
    orphans = [k for k in keys if k.tenant not in known]
    problems += [f"registry key {k.id}: no tenant {k.tenant}" for k in orphans]
    keys = [k for k in keys if k.tenant in known]
    return Registry(doc["version"], tuple(tenants), tuple(keys), tuple(problems), origin)


# Changes: each takes a document and returns what to report; the store bumps the version and
# writes the whole document (one change at a time, under its lock or compare-and-set).


def add_tenant(doc: Document, record: Document, policy_ids: Iterable[str]) -> Document:
    tid = str(record.get("id", ""))
    if not TENANT_ID_RE.fullmatch(tid):
        raise RegistryError(
            f"tenant id {tid!r} is not valid: use 1 to 64 of A-Z a-z 0-9 . _ - (no spaces)"
        )
    if tid in set(policy_ids):
        raise RegistryError(f"tenant {tid} is defined in the policy file: change it there")
    if tid in doc["tenants"]:
        raise RegistryError(f"tenant {tid} exists already (kvfence tenants list)")
    entry = {k: v for k, v in record.items() if k != "id"}
    entry["added"] = round(time.time(), 3)
    doc["tenants"][tid] = entry
    return {"id": tid, **entry}


def remove_tenant(doc: Document, tid: str, policy_ids: Iterable[str]) -> Document:
    if tid in set(policy_ids) and tid not in doc["tenants"]:
        raise RegistryError(f"tenant {tid} is defined in the policy file: remove it there")
    if tid not in doc["tenants"]:
        raise RegistryError(f"no tenant {tid} in the registry (kvfence tenants list)")
    del doc["tenants"][tid]
    gone = [kid for kid, rec in doc["keys"].items() if rec.get("tenant") == tid]
    for kid in gone:
        del doc["keys"][kid]
    return {"id": tid, "keys_removed": len(gone)}


def set_tenant(
    doc: Document,
    tid: str,
    changes: Mapping[str, Any],
    policy_ids: Iterable[str],
    *,
    check: Callable[[str, Document], object],
) -> Document:
    """Change a registry tenant: `models`, `scope` and `scope_header` (empty: removed) replace
    theirs; `limits` and `budgets` merge name by name (0 removes one) after `clear_limits` and
    `clear_budgets` empty them; `changed_by` is recorded with the time. `check(tid, record)`
    reads the changed record (the tenant reader) and raises what it refuses, before the
    document is touched."""
    if tid in set(policy_ids) and tid not in doc["tenants"]:
        raise RegistryError(f"tenant {tid} is defined in the policy file: change it there")
    if tid not in doc["tenants"]:
        raise RegistryError(f"no tenant {tid} in the registry (kvfence tenants list)")
    unknown = set(changes) - _CHANGES
    if unknown:
        raise RegistryError(f"cannot change {', '.join(sorted(unknown))} of a tenant")
    if not set(changes) - {"changed_by"}:
        raise RegistryError("nothing to change: give --model, --scope, --limit or --budget")
    if "models" in changes and not changes["models"]:
        raise RegistryError("a tenant needs at least one model")
    entry: Document = {**doc["tenants"][tid]}
    for name in ("models", "scope", "scope_header"):
        if changes.get(name):
            entry[name] = changes[name]
        elif name == "scope_header" and name in changes:
            entry.pop(name, None)
    for name in ("limits", "budgets"):
        given = changes.get(name) or {}
        if not isinstance(given, dict):
            raise RegistryError(f"{name} must be a mapping of names to numbers")
        merged = {} if changes.get(f"clear_{name}") else dict(entry.get(name) or {})
        merged |= given
        merged = {k: v for k, v in merged.items() if v != 0}
        if merged:
            entry[name] = merged
        else:
            entry.pop(name, None)
    entry["changed"] = round(time.time(), 3)
    entry.pop("changed_by", None)
    if changes.get("changed_by"):
        entry["changed_by"] = str(changes["changed_by"])[:LABEL_MAX]
    check(tid, entry)
    doc["tenants"][tid] = entry
    return {"id": tid, **entry}


def new_key(
    doc: Document,
    tenant: str,
    digest: str,
    *,
    known: Iterable[str],
    label: str = "",
    expires: float | None = None,
    budgets: Mapping[str, int] | None = None,
) -> Document:
    """Record a minted key's digest for `tenant` (one of `known`: policy or registry)."""
    if tenant not in set(known) and tenant not in doc["tenants"]:
        raise RegistryError(f"no tenant {tenant}: add it first (kvfence tenants add {tenant})")
    if len(label) > LABEL_MAX or any(not c.isprintable() for c in label):
        raise RegistryError(f"a key label is at most {LABEL_MAX} printable characters")
    now = round(time.time(), 3)
    if expires is not None and expires <= now:
        raise RegistryError("the expiry must be in the future")
    kid = key_id(digest)
    if kid in doc["keys"]:  # 48 bits of a digest: never by chance
        raise RegistryError("this key is registered already")
    rec: Document = {"tenant": tenant, "digest": digest, "label": label, "created": now}
    rec |= {"expires": expires, "revoked": None}
    if budgets:
        _budgets(dict(budgets), "--budget")  # refused here, not when the gateway reads it
        rec["budgets"] = dict(budgets)
    doc["keys"][kid] = rec
    return {"id": kid, **{k: v for k, v in rec.items() if k != "digest"}}


def find_key(doc: Document, ref: str) -> str:
    """A key id from an id or a unique prefix of one."""
    if ref in doc["keys"]:
        return str(ref)
    found = [kid for kid in doc["keys"] if kid.startswith(ref)] if len(ref) >= 6 else []
    if len(found) != 1:
        raise RegistryError(f"no key {ref} in the registry (kvfence keys list)")
    return str(found[0])


def revoke_key(doc: Document, ref: str) -> Document:
    kid = find_key(doc, ref)
    rec = doc["keys"][kid]
    if rec.get("revoked") is None:
        rec["revoked"] = round(time.time(), 3)
    return {"id": kid, "tenant": rec.get("tenant"), "revoked": rec["revoked"]}


def expire_key(doc: Document, ref: str, at: float) -> Document:
    kid = find_key(doc, ref)
    rec = doc["keys"][kid]
    rec["expires"] = round(at, 3)
    return {"id": kid, "tenant": rec.get("tenant"), "expires": rec["expires"]}
