"""Reading the policy's fleet settings: `gateway.routing` (how a model's backends share its
namespaces), `gateway.shared` (the Redis the gateway replicas share state in) and
`gateway.tracing` (where the replicas send their traces).

Invariant: every number is range-checked here, and a Redis password is a secret reference,
never inline text; a URL that carries a password is refused.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from gateway.policy.model import (
    ControlDatabase,
    ControlSettings,
    OnSharedFailure,
    RoutingSettings,
    RoutingStrategy,
    SharedSettings,
    TracingSettings,
)
from gateway.policy.node import Node, optional
from gateway.policy.secrets import resolve

_F = frozenset
_OTLP_URL_RE = re.compile(r"^https?://[A-Za-z0-9.:_\[\]-]+(/[A-Za-z0-9._/-]*)?$")
_SERVICE_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_REDIS_URL_RE = re.compile(r"^(redis|rediss)://([A-Za-z0-9._-]+)(:\d{1,5})?(/\d{1,2})?$")
_USER_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_PG_URL_RE = re.compile(
    r"^postgres(ql)?://[A-Za-z0-9._-]{1,63}@[A-Za-z0-9._-]+(:\d{1,5})?/[A-Za-z0-9._-]{1,63}$"
)


def read_routing(node: Node) -> RoutingSettings:
    f = node.mapping(_F(), _F({"strategy", "retries", "eject_after_errors", "eject_for_s"}))
    return RoutingSettings(
        **optional(
            f,
            strategy=lambda n: RoutingStrategy(n.choice(tuple(RoutingStrategy))),
            retries=lambda n: n.integer(0, 8),
            eject_after_errors=lambda n: n.integer(1, 1000),
            eject_for_s=lambda n: n.number(0.1, 3600.0),
        )
    )


def read_shared(node: Node, env: Mapping[str, str], base: Path) -> SharedSettings:
    f = node.mapping(_F({"redis"}), _F({"on_failure"}))
    r = f["redis"].mapping(
        _F({"url"}), _F({"password", "username", "ca_file", "timeout_s", "lease_s"})
    )
    url = r["url"].text(_REDIS_URL_RE, "like redis://host:6379/0 (a password goes in password:)")
    if "username" in r and "password" not in r:
        r["username"].fail("an ACL user needs its password (password: {file: ...})")
    if "ca_file" in r and not url.startswith("rediss://"):
        r["ca_file"].fail("needs a rediss:// url (TLS)")
    return SharedSettings(
        url,
        **optional(r, password=lambda n: resolve(n, env, base, 1)),
        **optional(r, username=lambda n: n.text(_USER_RE, "of [A-Za-z0-9._-], at most 64")),
        **optional(r, ca_file=lambda n: _ca_file(n, base)),
        **optional(f, on_failure=lambda n: OnSharedFailure(n.choice(tuple(OnSharedFailure)))),
        **optional(
            r, timeout_s=lambda n: n.number(0.01, 30.0), lease_s=lambda n: n.number(10.0, 86400.0)
        ),
    )


def read_control(node: Node, env: Mapping[str, str], base: Path) -> ControlSettings:
    """`gateway.control`: `{database: sqlite[, path]}` or `{database: postgresql, url,
    password}`; the password is a secret reference, never part of the URL."""
    f = node.mapping(_F({"database"}), _F({"path", "url", "password", "timeout_s"}))
    database = ControlDatabase(f["database"].choice(tuple(ControlDatabase)))
    timeout = optional(f, timeout_s=lambda n: n.number(0.05, 60.0))
    if database is ControlDatabase.SQLITE:
        for name in ("url", "password"):
            if name in f:
                f[name].fail("only for database: postgresql")
        return ControlSettings(database, **optional(f, path=lambda n: base / n.text()), **timeout)
    if "path" in f:
        f["path"].fail("only for database: sqlite")
    if "url" not in f or "password" not in f:
        node.fail("database postgresql needs url and password: {file: ...}")
    url = f["url"].text(_PG_URL_RE, "like postgresql://kvfence@db:5432/kvfence (no password)")
    return ControlSettings(database, url=url, password=resolve(f["password"], env, base, 1),
                           **timeout)  # fmt: skip


def _ca_file(node: Node, base: Path) -> Path:
    path = base / node.text()
    if not path.is_file():
        node.fail(f"cannot read {path}: not a file (the PEM bundle of Redis's CA)")
    return path


def read_tracing(node: Node, env: Mapping[str, str], base: Path) -> TracingSettings:
    f = node.mapping(_F({"otlp_endpoint"}), _F({"service_name", "sample_ratio", "batch_delay_s",
                                                "headers"}))  # fmt: skip
    url = f["otlp_endpoint"].text(_OTLP_URL_RE, "like http://collector:4318/v1/traces")
    return TracingSettings(
        url,
        **optional(
            f,
            service_name=lambda n: n.text(_SERVICE_RE, "of [A-Za-z0-9._-], at most 64"),
            sample_ratio=lambda n: n.number(0.0, 1.0),
            batch_delay_s=lambda n: n.number(0.05, 60.0),
            headers=lambda n: resolve(n, env, base, 1),
        ),
    )
