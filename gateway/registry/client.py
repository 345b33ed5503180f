"""The registry's side of `kvfence tenants` and `kvfence keys`: where a change goes (a running
gateway's admin listener, found from the policy, or the registry file itself when no gateway
answers or `--offline` says so), the calls, and their output.

Invariant: a new key is shown once (or written to a new 0600 file) and never stored; offline
changes take the same checks and the same lock as the admin listener's, so both ways give the
same registry; every refusal is one line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.control.offline import OfflineRegistry
from gateway.policy import registry as reg
from gateway.policy.load import load_policy
from gateway.policy.model import Policy
from gateway.policy.node import PolicyError
from gateway.policy.registry import RegistryError
from gateway.policy.registry_view import (
    check_record,
    keys_view,
    tenant_ids,
    tenant_record,
    tenants_view,
)
from gateway.policy.runtime import registry_of
from kvfence.keys.apikey import key_digest, mint_key
from kvfence.keys.secrets import SecretError, from_env, from_file


class Unreachable(Exception):
    """No gateway answers at the admin URL."""


@dataclass
class Target:
    """Where the registry is changed: `url` (online, with `token`), else the policy's file."""

    policy: Policy | None
    url: str | None
    token: str | None
    said: str = ""  # how the change was made, for the user

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        assert self.url is not None
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(  # noqa: S310 (http(s) checked by admin_url)
            self.url.rstrip("/") + path, data=data, method=method
        )
        request.add_header("content-type", "application/json")
        if self.token:
            request.add_header("authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=30) as resp:  # noqa: S310
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            with exc:  # an error answer holds its connection until closed
                said = f"{exc.code}: {_message(exc.read())}"
            registry = self.policy.registry if self.policy is not None else None
            if exc.code == 403 and registry is not None:
                said += " (or change the registry file itself: add --offline)"
            raise RegistryError(said) from None
        except (urllib.error.URLError, OSError) as exc:
            raise Unreachable(f"no gateway answers at {self.url} ({_reason(exc)})") from None


def _message(raw: bytes) -> str:
    try:
        error = json.loads(raw)["error"]
        return str(error["message"])
    except (ValueError, KeyError, TypeError):
        return raw.decode(errors="replace")[:200]


def _reason(exc: Exception) -> str:
    reason = getattr(exc, "reason", exc)
    return getattr(reason, "strerror", None) or str(reason)


def connect_url(host: str, port: int) -> str:
    """An admin listener's URL as a client reaches it (a wildcard host means this host)."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)  # noqa: S104 (not a bind)
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{port}"


def admin_url(policy: Policy) -> str:
    return connect_url(policy.gateway.admin.host, policy.gateway.admin.port)


def admin_token(policy: Policy) -> str | None:
    token = policy.gateway.admin.token
    return None if token is None else token.value.decode()


def add_target_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", metavar="FILE", help="the gateway's policy (finds the rest)")
    parser.add_argument("--url", help="a gateway's admin listener (default: the policy's)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--token-file", type=Path, help="admin token file (default: the policy's)")
    source.add_argument("--token-env", help="env var holding the admin token")
    parser.add_argument(
        "--offline", action="store_true", help="change the registry file directly, not a gateway"
    )
    parser.add_argument("--json", action="store_true", help="print JSON")


def target(args: argparse.Namespace) -> Target:
    """Online when `--url` is given or the policy's admin listener answers; else offline."""
    policy = None
    if args.policy:
        policy = load_policy(args.policy)  # PolicyError: the caller prints its lines
        if policy.registry is None:
            raise RegistryError(
                f"{args.policy} has no tenant registry: add `registry: true` (docs/policy.md)"
            )
    elif not args.url:
        raise RegistryError("give --policy FILE (or --url with the admin token)")
    token = _token(args) or (admin_token(policy) if policy else None)
    url = args.url or (admin_url(policy) if policy else None)
    if args.offline:
        if policy is None:
            raise RegistryError("--offline needs --policy FILE")
        url = None
    return Target(policy, url, token)


def _token(args: argparse.Namespace) -> str | None:
    try:
        if args.token_file is not None:
            return from_file(args.token_file).decode()
        if args.token_env:
            return from_env(args.token_env).decode()
    except SecretError as exc:
        raise RegistryError(str(exc)) from None
    return None


def run(t: Target, online: Any, offline: Any) -> Any:
    """`online(t)` through the gateway; when none answers and the registry is a file the policy
    names, `offline(policy, file)` instead (said on stderr)."""
    if t.url is not None:
        try:
            result = online(t)
            t.said = f"through the gateway at {t.url}"
            return result
        except Unreachable as exc:
            if t.policy is None:
                raise RegistryError(str(exc)) from None
    assert t.policy is not None and t.policy.registry is not None
    registry = OfflineRegistry(t.policy)
    t.said = f"offline, in the control database {registry.where}"
    return offline(t.policy, registry)


def fail(command: str, exc: Exception) -> int:
    if isinstance(exc, PolicyError):
        print("\n".join(exc.errors), file=sys.stderr)
    else:
        print(f"kvfence {command}: {exc}", file=sys.stderr)
    return 2


def when(t: float | None) -> str:
    if t is None:
        return "never"
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(t))


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)  # fmt: skip


# Offline operations: the admin listener's, on the registry file.


def offline_tenants(policy: Policy, file: OfflineRegistry) -> Any:
    doc = file.read()
    return tenants_view(policy, registry_of(policy, doc), doc, time.time())


def offline_keys(policy: Policy, file: OfflineRegistry, tenant: str | None) -> Any:
    doc = file.read()
    return {"keys": keys_view(policy, registry_of(policy, doc), tenant, time.time())}


def offline_add(policy: Policy, file: OfflineRegistry, spec: dict[str, Any]) -> Any:
    record = tenant_record(policy, spec)
    ids = [t.id for t in policy.tenants]
    return {"added": file.update(lambda doc: reg.add_tenant(doc, record, ids))}


def offline_set(policy: Policy, file: OfflineRegistry, tid: str, changes: dict[str, Any]) -> Any:
    ids = [t.id for t in policy.tenants]

    def change(doc: reg.Document) -> reg.Document:
        return reg.set_tenant(doc, tid, changes, ids, check=lambda t, r: check_record(policy, t, r))

    return {"changed": file.update(change)}


def offline_remove(policy: Policy, file: OfflineRegistry, tid: str) -> Any:
    ids = [t.id for t in policy.tenants]
    return {"removed": file.update(lambda doc: reg.remove_tenant(doc, tid, ids))}


def offline_new_key(policy: Policy, file: OfflineRegistry, body: dict[str, Any]) -> Any:
    key = mint_key()
    digest = key_digest(policy.gateway.api_key_pepper.value, key)

    def change(doc: reg.Document) -> reg.Document:
        return reg.new_key(
            doc, body["tenant"], digest, known=tenant_ids(policy, doc), label=body["label"],
            expires=body["expires"], budgets=body["budgets"] or None,
        )  # fmt: skip

    return {"key": key, **file.update(change)}


def offline_revoke(policy: Policy, file: OfflineRegistry, ref: str) -> Any:
    return {"revoked": file.update(lambda doc: reg.revoke_key(doc, ref))}


def offline_expire(policy: Policy, file: OfflineRegistry, ref: str, at: float) -> Any:
    return {"expired": file.update(lambda doc: reg.expire_key(doc, ref, at))}
