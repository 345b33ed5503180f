"""The policy's tenants and public prefixes, as frozen dataclasses (`gateway.policy.tenants` and
`gateway.policy.public` read them)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Scope(StrEnum):
    TENANT = "tenant"
    USER = "user"
    SESSION = "session"
    REQUEST = "request"  # each request its own namespace: no reuse at all


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """What one tenant may use, across every worker of the gateway (0: no limit)."""

    requests_per_s: float = 0.0
    burst: float = 0.0  # the requests a full bucket allows at once (0: one second's, at least 1)
    concurrent: int = 0  # requests in flight
    tokens_per_min: int = 0  # prompt + completion tokens, charged from each answer's usage

    def __post_init__(self) -> None:
        if not self.burst:
            object.__setattr__(self, "burst", max(1.0, self.requests_per_s))

    @property
    def any(self) -> bool:
        return bool(self.requests_per_s or self.concurrent or self.tokens_per_min)


@dataclass(frozen=True, slots=True)
class TenantBudgets:
    """Tokens (prompt + completion) a tenant or one of its keys may use per calendar period in
    UTC (0: no budget), across every worker and, with `gateway.shared`, every replica."""

    hour: int = 0
    day: int = 0
    month: int = 0

    @property
    def any(self) -> bool:
        return bool(self.hour or self.day or self.month)


@dataclass(frozen=True, slots=True)
class TenantCache:
    """The tenant's share of our backends' KV pools (all its namespaces together): at most
    `ceiling`; other tenants may not evict its cached blocks below `floor` (None: half the pool
    split evenly between the policy's tenants)."""

    ceiling: float = 0.5
    floor: float | None = None


@dataclass(frozen=True, slots=True)
class TenantPublic:
    """Which public prefixes a tenant's requests use: the policy's declared ones (`declared`),
    and its own leading messages it marks public per request (`own`; shared by its users and
    sessions, never with another tenant)."""

    declared: bool = True
    own: bool = False


@dataclass(frozen=True, slots=True)
class TenantReceipts:
    """Whether this tenant's answers get receipts, and how long they are kept (None: the
    gateway's `receipts.keep_s`)."""

    enabled: bool = True
    keep_s: float | None = None


@dataclass(frozen=True, slots=True)
class Tenant:
    id: str
    api_keys: tuple[str, ...]
    scope: Scope
    models: tuple[str, ...]
    scope_header: str | None = None  # where a user or session id may arrive besides the body
    limits: TenantLimits = TenantLimits()
    cache: TenantCache = TenantCache()
    public: TenantPublic = TenantPublic()
    receipts: TenantReceipts = TenantReceipts()
    budgets: TenantBudgets = TenantBudgets()


@dataclass(frozen=True, slots=True)
class PublicPrefix:
    """A declared public prefix of one model: leading chat messages as (role, content), roles as
    our backend reads them; `text` when declared as one text (a system message for chat, the
    leading text of a completion prompt)."""

    name: str
    model: str
    messages: tuple[tuple[str, str], ...]
    text: str | None = None

    @property
    def size(self) -> int:
        return sum(len(content) for _, content in self.messages)


@dataclass(frozen=True, slots=True)
class PublicSettings:
    """The policy's public prefixes and their capacity in our backends' KV pools: a group of
    their own, counted against no tenant's ceiling, that tenants may not evict below `floor`."""

    prefixes: tuple[PublicPrefix, ...] = ()
    ceiling: float = 0.25
    floor: float = 0.25
