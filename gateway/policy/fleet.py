"""Reading the policy's fleet settings: `gateway.routing` (how a model's backends share its
namespaces) and `gateway.shared` (the Redis the gateway replicas share state in).

Invariant: every number is range-checked here, and a Redis password is a secret reference,
never inline text; a URL that carries a password is refused.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from gateway.policy.model import OnSharedFailure, RoutingSettings, RoutingStrategy, SharedSettings
from gateway.policy.node import Node
from gateway.policy.secrets import resolve

_F = frozenset
_REDIS_URL_RE = re.compile(r"^(redis|rediss)://([A-Za-z0-9._-]+)(:\d{1,5})?(/\d{1,2})?$")


def read_routing(node: Node) -> RoutingSettings:
    f = node.mapping(_F(), _F({"strategy", "retries", "eject_after_errors", "eject_for_s"}))
    d = RoutingSettings()
    return RoutingSettings(
        strategy=RoutingStrategy(f["strategy"].choice(tuple(RoutingStrategy)))
        if "strategy" in f
        else d.strategy,
        retries=f["retries"].integer(0, 8) if "retries" in f else d.retries,
        eject_after_errors=f["eject_after_errors"].integer(1, 1000)
        if "eject_after_errors" in f
        else d.eject_after_errors,
        eject_for_s=f["eject_for_s"].number(0.1, 3600.0) if "eject_for_s" in f else d.eject_for_s,
    )


def read_shared(node: Node, env: Mapping[str, str], base: Path) -> SharedSettings:
    f = node.mapping(_F({"redis"}), _F({"on_failure"}))
    r = f["redis"].mapping(_F({"url"}), _F({"password", "timeout_s", "lease_s"}))
    url = r["url"].text(_REDIS_URL_RE, "like redis://host:6379/0 (a password goes in password:)")
    d = SharedSettings(url)
    return SharedSettings(
        redis_url=url,
        password=resolve(r["password"], env, base, 1) if "password" in r else None,
        on_failure=OnSharedFailure(f["on_failure"].choice(tuple(OnSharedFailure)))
        if "on_failure" in f
        else d.on_failure,
        timeout_s=r["timeout_s"].number(0.01, 30.0) if "timeout_s" in r else d.timeout_s,
        lease_s=r["lease_s"].number(10.0, 86400.0) if "lease_s" in r else d.lease_s,
    )
