"""`kvfence audit tenants --policy FILE [LABEL ...]`: whose namespaces the audit records name.
A record holds namespace labels (32 hex characters of a namespace's SHA-256): its own and, for
an answer that used another's blocks, the `foreign_namespaces`. Whoever holds the policy's
namespace keys can derive every tenant's namespace for every served model (under every key,
the retired ones too, since records outlive rotations) and so name the tenant behind a label:
the victims of a violation, or a label seen in a backend's metrics.

Invariant: read-only; a label is named only when a derivation reproduces it exactly (user and
session scopes need the scope value: `--scope-value`); anything else is said to be unknown,
never guessed. Check the log first with `kvfence audit verify`.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from gateway.audit.chain.chains import ChainsError, find_chains
from gateway.audit.chain.format import rotated_paths
from gateway.control.offline import OfflineRegistry
from gateway.policy.load import load_policy
from gateway.policy.model import Policy
from gateway.policy.node import PolicyError
from gateway.policy.registry import RegistryError
from gateway.policy.runtime import registry_of
from kvfence.namespace import NamespaceKey, derive_namespace, namespace_label, public_namespace


@dataclass(frozen=True, slots=True)
class Named:
    tenant: str  # "" for the declared public prefixes' namespace
    model: str
    scope: str
    key_id: str

    def __str__(self) -> str:
        who = f"tenant {self.tenant}" if self.tenant else "the public prefixes"
        return f"{who} (model {self.model}, scope {self.scope}, namespace key {self.key_id})"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("labels", nargs="*", help="namespace labels to name (besides the log's)")
    parser.add_argument("--policy", type=Path, required=True, help="the gateway's policy")
    parser.add_argument("--log", type=Path, help="the audit log (default: the policy's)")
    parser.add_argument(
        "--scope-value",
        action="append",
        default=[],
        metavar="VALUE",
        help="a user or session id to try for user and session scopes (repeat)",
    )


def names(policy: Policy, values: list[str]) -> dict[str, Named]:
    """Label -> who, for every tenant (the policy's and the registry's), served model, scope
    value tried and namespace key."""
    tenants = list(policy.tenants)
    if policy.registry is not None:
        tenants += registry_of(policy, OfflineRegistry(policy).read()).tenants
    models = {(m.name, m.revision) for b in policy.backends for m in b.models}
    out: dict[str, Named] = {}
    for spec in policy.gateway.namespace_keys:
        key = NamespaceKey(spec.id, spec.secret.value)
        for model, revision in sorted(models):
            out[namespace_label(public_namespace(key, model, revision))] = Named(
                "", model, "public", spec.id
            )
            for tenant in tenants:
                tried = [""] if tenant.scope.value == "tenant" else values
                for value in tried:
                    ns = derive_namespace(
                        key, tenant.id, tenant.scope.value, value, model, revision
                    )
                    scope = tenant.scope.value + (f" {value!r}" if value else "")
                    out[namespace_label(ns)] = Named(tenant.id, model, scope, spec.id)
                own = public_namespace(key, model, revision, tenant.id)
                out[namespace_label(own)] = Named(tenant.id, model, "its own public", spec.id)
    return out


def records(path: Path) -> Iterator[tuple[str, int, dict[str, Any]]]:
    """Every record of every worker's chain of the log at `path`: (file, line, record)."""
    for chain in find_chains(path, None, None):
        for file in [*rotated_paths(chain.path), chain.path]:
            if not file.exists():
                continue
            with file.open("rb") as lines:
                for n, line in enumerate(lines, 1):
                    try:
                        entry = orjson.loads(line)
                    except orjson.JSONDecodeError:
                        continue  # a torn last line; `audit verify` reports it
                    if isinstance(entry, dict) and entry.get("kind") == "record":
                        yield file.name, n, entry


def main(args: argparse.Namespace) -> int:
    try:
        policy = load_policy(args.policy)
        table = names(policy, args.scope_value)
        log = args.log or (policy.gateway.audit_log.path if policy.gateway.audit_log else None)
        found = list(records(log)) if log is not None else []
    except PolicyError as exc:
        print("\n".join(exc.errors), file=sys.stderr)
        return 2
    except (ChainsError, RegistryError, OSError) as exc:
        print(f"kvfence audit: {exc}", file=sys.stderr)
        return 2
    for label in args.labels:
        print(f"{label}: {table.get(label) or 'unknown (another scope value, key or tenant)'}")
    affected: Counter[str] = Counter()
    foreign = 0
    for file, line, entry in found:
        labels = entry.get("foreign_namespaces") or []
        if not labels:
            continue
        foreign += 1
        victims = [str(table[x]) if x in table else f"unknown {x}" for x in labels]
        affected.update(table[x].tenant or "(public)" for x in labels if x in table)
        print(
            f"{file}:{line}: request {entry.get('request_id')} of tenant {entry.get('tenant')} "
            f"on {entry.get('backend')} ({entry.get('verdict')}) used blocks of: "
            + "; ".join(victims)
        )
    if log is not None:
        print(f"{len(found)} records, {foreign} naming foreign namespaces")
        for tenant, count in affected.most_common():
            print(f"  affected: {tenant} in {count} records")
    return 0
