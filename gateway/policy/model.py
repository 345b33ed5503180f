"""The policy, version 1, as frozen dataclasses: what `gateway.policy.load` returns.

Invariant: a `Policy` is fully validated and its secrets resolved; requests only read it, and a
reload replaces the whole object.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from kvfence.keyfile import TrustStore


class Scope(StrEnum):
    TENANT = "tenant"
    USER = "user"
    SESSION = "session"
    REQUEST = "request"  # each request its own namespace: no reuse at all


class ClientInputMode(StrEnum):
    STRIP = "strip"
    REJECT = "reject"


class UnknownFieldMode(StrEnum):
    DROP = "drop"
    REJECT = "reject"


class AuditMode(StrEnum):
    ENFORCE = "enforce"
    MONITOR = "monitor"


@dataclass(frozen=True, slots=True)
class SecretRef:
    """`{env: NAME}` or `{file: PATH}`; never the secret itself."""

    source: str  # "env" | "file"
    name: str

    def __str__(self) -> str:
        return f"{{{self.source}: {self.name}}}"


@dataclass(frozen=True, slots=True)
class Secret:
    ref: SecretRef
    value: bytes = field(repr=False)


@dataclass(frozen=True, slots=True)
class Listen:
    host: str = "127.0.0.1"
    port: int = 8080


@dataclass(frozen=True, slots=True)
class NamespaceKeySpec:
    id: str
    secret: Secret
    active: bool


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Upstream timeouts in seconds."""

    connect_s: float = 5.0
    first_byte_s: float = 120.0
    idle_s: float = 60.0


@dataclass(frozen=True, slots=True)
class ClientLimits:
    """What a client may cost: an idle or trickling client is cut, not held."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_body_bytes: int = 4 * 1024 * 1024
    max_connections: int = 1024
    max_connections_per_client: int = 256  # per client address
    max_in_flight: int = 512  # proxied requests at once per worker; beyond: 503 + Retry-After
    write_timeout_s: float = 30.0  # a streaming client that reads nothing this long is cut
    max_answer_bytes: int = 32 * 1024 * 1024  # a plain (non-streamed) upstream answer, whole


class FsyncMode(StrEnum):
    ALWAYS = "always"
    BATCH = "batch"


@dataclass(frozen=True, slots=True)
class HandleKey:
    """The key the gateway signs handles with (used by the kvfence adapter), loaded once."""

    id: str
    private_key: SecretRef
    key: Ed25519PrivateKey = field(repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class AuditLogSettings:
    """Where and how the audit log is written; equal settings keep the open log on reload."""

    path: Path
    key: Secret
    fsync: FsyncMode = FsyncMode.ALWAYS
    batch_max_records: int = 64
    batch_max_ms: float = 50.0
    rotate_bytes: int = 64 << 20
    anchor: Path | None = None  # outside the log's folder: makes rollback detectable


@dataclass(frozen=True, slots=True)
class AdminSettings:
    """The admin listener (/status, /metrics, canary rounds, quarantine release): its own port,
    loopback by default, never the tenant listener. Actions need the bearer token."""

    host: str = "127.0.0.1"
    port: int = 8081
    token: Secret | None = None


@dataclass(frozen=True, slots=True)
class HistorySettings:
    """The detective audit's history of prompt-prefix fingerprints, shared by all workers.
    `block_max_age_s`: how long a server may keep an unused cached block; an unexplained hit is
    a violation only once the history reaches that far back (else it is `unexplained`)."""

    capacity: int = 1 << 20
    block_max_age_s: float = 3600.0


@dataclass(frozen=True, slots=True)
class GatewaySettings:
    namespace_keys: tuple[NamespaceKeySpec, ...]
    api_key_pepper: Secret
    listen: Listen = Listen()
    client_inputs: ClientInputMode = ClientInputMode.STRIP
    unknown_fields: UnknownFieldMode = UnknownFieldMode.DROP
    timeouts: Timeouts = Timeouts()
    limits: ClientLimits = ClientLimits()
    access_log: bool = True
    handle_key: HandleKey | None = None
    handle_ttl_s: float = 60.0
    audit_log: AuditLogSettings | None = None
    admin: AdminSettings = AdminSettings()
    state_dir: Path | None = None  # shared verification state; a private temp dir when unset
    history: HistorySettings = HistorySettings()

    @property
    def active_key(self) -> NamespaceKeySpec:
        return next(k for k in self.namespace_keys if k.active)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    revision: str


@dataclass(frozen=True, slots=True)
class KvfenceOptions:
    """Fields only a `kind: kvfence` backend has."""

    audience: str
    attestation_keys: SecretRef
    trust: TrustStore = field(repr=False, compare=False)  # parsed from `attestation_keys`


class OnShared(StrEnum):
    QUARANTINE = "quarantine"
    ALERT = "alert"


@dataclass(frozen=True, slots=True)
class CanarySettings:
    """Canary rounds against one external backend: a fresh random prompt sent twice in canary
    namespace A (the second must hit) and once in B (must not)."""

    interval_s: float = 300.0
    prompt_tokens: int = 384
    on_shared: OnShared = OnShared.QUARANTINE
    clean_rounds: int = 3  # clean rounds in a row that release a quarantine
    timing_samples: int = 4  # prompts per round when the server reports no cached tokens


@dataclass(frozen=True, slots=True)
class DetectiveSettings:
    """The per-answer check of reported cached tokens against the namespace's history: exact
    with the model's tokenizer (a Hugging Face directory), else a sound upper bound."""

    tokenizer: Path | None = None
    block_size: int = 16
    template_overhead_tokens: int = 64
    message_overhead_tokens: int = 8


@dataclass(frozen=True, slots=True)
class VerifySettings:
    canary: CanarySettings | None = CanarySettings()
    detective: DetectiveSettings | None = DetectiveSettings()


@dataclass(frozen=True, slots=True)
class Backend:
    name: str
    kind: str
    url: str
    models: tuple[ModelSpec, ...]
    allow_unscoped: bool = False
    api_key: Secret | None = None
    kvfence: KvfenceOptions | None = None
    audit: AuditMode = AuditMode.ENFORCE  # what a verdict other than clean/verified does
    verify: VerifySettings | None = None  # external scoped kinds: canaries and detective audit
    extra_fields: frozenset[str] = frozenset()  # body fields beyond OpenAI's (filters.fields)
    required: bool = True  # /readyz answers 503 while this backend is down


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """What one tenant may use, across every worker of the gateway (0: no limit)."""

    requests_per_s: float = 0.0
    burst: float = 0.0  # the requests a full bucket allows at once (default: one second's)
    concurrent: int = 0  # requests in flight
    tokens_per_min: int = 0  # prompt + completion tokens, charged from each answer's usage

    @property
    def any(self) -> bool:
        return bool(self.requests_per_s or self.concurrent or self.tokens_per_min)


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
class Tenant:
    id: str
    api_keys: tuple[str, ...]
    scope: Scope
    models: tuple[str, ...]
    scope_header: str | None = None  # where a user or session id may arrive besides the body
    limits: TenantLimits = TenantLimits()
    cache: TenantCache = TenantCache()
    public: TenantPublic = TenantPublic()


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


@dataclass(frozen=True, slots=True)
class Policy:
    source: str
    version: int
    gateway: GatewaySettings
    backends: tuple[Backend, ...]
    tenants: tuple[Tenant, ...]
    public: PublicSettings = PublicSettings()

    def summary(self) -> str:
        models = sum(len(b.models) for b in self.backends)
        return (
            f"{self.source}: ok: {len(self.tenants)} tenants, {len(self.backends)} backends, "
            f"{models} models, active namespace key {self.gateway.active_key.id}"
        )
