"""The policy, version 1, as frozen dataclasses: what `gateway.policy.load` returns. The whole
and the gateway's settings here; the backends in `backend_model`, the tenants and public
prefixes in `tenant_model`, a secret reference in `secrets` (each imports none of the others
but `secrets`, so the policy's types form no cycle).

Invariant: a `Policy` is fully validated and its secrets resolved; requests only read it, and a
reload replaces the whole object.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gateway.policy.backend_model import Backend
from gateway.policy.secrets import Secret, SecretRef
from gateway.policy.tenant_model import PublicSettings, Tenant


class ClientInputMode(StrEnum):
    STRIP = "strip"
    REJECT = "reject"


class UnknownFieldMode(StrEnum):
    DROP = "drop"
    REJECT = "reject"


@dataclass(frozen=True, slots=True)
class Listen:
    host: str = "127.0.0.1"
    port: int = 8080


@dataclass(frozen=True, slots=True)
class NamespaceKeySpec:
    id: str
    secret: Secret
    active: bool = False  # the loader reads `active` as optional: an old key omits it


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Upstream timeouts in seconds."""

    connect_s: float = 5.0
    first_byte_s: float = 120.0  # a stream: until its headers
    idle_s: float = 60.0
    total_s: float = 600.0  # a plain answer, whose headers come only when it is done: all of it


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
class CheckpointSettings:
    """The audit log as a witnessed log: `name` is its checkpoints' origin (NAME/wK for worker
    K's chain), `key` signs them (and names the gateway: receipts' workload_id), at most one per
    `interval_s` while it grows; cosignatures are accepted from `witnesses` (vkeys)."""

    name: str
    key_ref: SecretRef
    key: Ed25519PrivateKey = field(repr=False, compare=False)
    interval_s: float = 1.0
    witnesses: tuple[str, ...] = ()


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
    checkpoints: CheckpointSettings | None = None


@dataclass(frozen=True, slots=True)
class ReceiptKeySpec:
    """One receipt signing key: the active one signs, the others still verify (rotation)."""

    id: str
    ref: SecretRef
    key: Ed25519PrivateKey = field(repr=False, compare=False)
    active: bool = False


@dataclass(frozen=True, slots=True)
class ReceiptSettings:
    """Receipts: kept in the control-plane database for `keep_s` (a tenant may keep its own
    shorter or longer, or have none), signed by the active key of `keys`. `path`, read by
    earlier versions, is no longer used."""

    path: Path | None
    keys: tuple[ReceiptKeySpec, ...]
    keep_s: float = 7 * 86400.0

    @property
    def active(self) -> ReceiptKeySpec:
        return next(k for k in self.keys if k.active)


@dataclass(frozen=True, slots=True)
class AdminSettings:
    """The admin listener (/status, /metrics, canary rounds, quarantine release): its own port,
    loopback by default, never the tenant listener. Actions need the bearer token."""

    host: str = "127.0.0.1"
    port: int = 8081
    token: Secret | None = None


@dataclass(frozen=True, slots=True)
class HistorySettings:
    """The detective audit's history of prompt-prefix keys, shared by all workers (and, with
    `gateway.shared`, by every replica). `capacity` records in all, at most `tenant_cap` per
    tenant (a tenant's traffic evicts only its own records while a region is free; after that
    the largest tenant's oldest go first, never a tenant's whole history); `block_max_age_s`:
    how long a server may keep an unused cached block: a tenant whose records reach back less
    than that after its cap evicted some is reported (an alert: raise `tenant_cap`)."""

    capacity: int = 1 << 20
    tenant_cap: int = 1 << 14
    block_max_age_s: float = 3600.0


class RoutingStrategy(StrEnum):
    AFFINITY = "affinity"  # rendezvous hashing of the namespace: it keeps its cache
    ROUND_ROBIN = "round_robin"  # for comparison (bench/fleet_routing.py); spreads a namespace


@dataclass(frozen=True, slots=True)
class RoutingSettings:
    """How a model served by several backends picks one (gateway.routing)."""

    strategy: RoutingStrategy = RoutingStrategy.AFFINITY
    retries: int = 1  # further backends tried when one fails before the first byte
    eject_after_errors: int = 3  # consecutive errors that eject a backend (this worker)
    eject_for_s: float = 30.0  # how long an ejected backend gets no traffic


class OnSharedFailure(StrEnum):
    CLOSED = "closed"  # 503 while the shared state cannot be reached
    LOCAL = "local"  # fall back to this gateway's own limits and last known health


@dataclass(frozen=True, slots=True)
class SharedSettings:
    """State the gateway replicas share in Redis: tenant limits, quarantine and canary state."""

    redis_url: str
    password: Secret | None = None
    username: str | None = None  # a Redis ACL user (with `password`); None: the default user
    ca_file: Path | None = None  # rediss:// only: the CA that signed Redis's certificate
    on_failure: OnSharedFailure = OnSharedFailure.CLOSED
    timeout_s: float = 0.5  # per Redis command
    lease_s: float = 600.0  # an in-flight count a dead replica left expires after this


@dataclass(frozen=True, slots=True)
class TracingSettings:
    """OpenTelemetry traces (the `otel` extra): one span per request, exported over OTLP/HTTP
    (`gateway.audit.trace`). Off unless the policy has `gateway.tracing`."""

    otlp_endpoint: str  # e.g. http://127.0.0.1:4318/v1/traces
    service_name: str = "kvfence-gateway"
    sample_ratio: float = 1.0  # of requests without a sampled parent (a parent's choice wins)
    batch_delay_s: float = 5.0  # spans are sent in batches at most this far apart
    headers: Secret | None = None  # `key=value,...` sent to the collector (an auth token)


class RegistryStore(StrEnum):
    DATABASE = "database"  # the control-plane database (gateway.control): the only store


@dataclass(frozen=True, slots=True)
class RegistrySettings:
    """Where the tenant registry lives (`gateway.policy.registry`): tenants and keys that
    `kvfence tenants` and `kvfence keys` change without editing the policy."""

    store: RegistryStore
    path: Path  # a registry file an earlier version kept: imported once into an empty database


class ControlDatabase(StrEnum):
    SQLITE = "sqlite"  # one file in state_dir: one gateway (all its workers)
    POSTGRESQL = "postgresql"  # a server every gateway of a fleet shares


@dataclass(frozen=True, slots=True)
class ControlSettings:
    """The control-plane database (`gateway.control`): tenants, keys and revocations, spend
    and quarantine decisions, what must outlive every restart (`gateway.control`)."""

    database: ControlDatabase = ControlDatabase.SQLITE
    path: Path | None = None  # sqlite: the file (default state_dir/control.db)
    url: str = ""  # postgresql: postgresql://USER@HOST:PORT/DB (no password in it)
    password: Secret | None = None  # postgresql
    timeout_s: float = 2.0  # per statement


@dataclass(frozen=True, slots=True)
class GatewaySettings:
    namespace_keys: tuple[NamespaceKeySpec, ...]
    api_key_pepper: Secret
    listen: Listen = Listen()
    client_inputs: ClientInputMode = ClientInputMode.STRIP
    unknown_fields: UnknownFieldMode = UnknownFieldMode.REJECT
    timeouts: Timeouts = Timeouts()
    limits: ClientLimits = ClientLimits()
    access_log: bool = True
    handle_key: HandleKey | None = None
    handle_ttl_s: float = 60.0
    audit_log: AuditLogSettings | None = None
    admin: AdminSettings = AdminSettings()
    state_dir: Path | None = None  # shared verification state; a private temp dir when unset
    history: HistorySettings = HistorySettings()
    routing: RoutingSettings = RoutingSettings()
    shared: SharedSettings | None = None
    control: ControlSettings = ControlSettings()
    receipts: ReceiptSettings | None = None
    tracing: TracingSettings | None = None

    @property
    def active_key(self) -> NamespaceKeySpec:
        return next(k for k in self.namespace_keys if k.active)

    @property
    def field_modes(self) -> tuple[bool, bool]:
        """(refuse a scoping field, refuse an unknown field), as the body allowlist takes them."""
        return (
            self.client_inputs is ClientInputMode.REJECT,
            self.unknown_fields is UnknownFieldMode.REJECT,
        )


@dataclass(frozen=True, slots=True)
class Policy:
    source: str
    version: int
    gateway: GatewaySettings
    backends: tuple[Backend, ...]
    tenants: tuple[Tenant, ...]
    public: PublicSettings = field(default_factory=PublicSettings)
    registry: RegistrySettings | None = None
    # Every file the load read besides the policy (the reload watcher follows them too).
    sources: frozenset[Path] = frozenset()

    def summary(self) -> str:
        models = sum(len(b.models) for b in self.backends)
        registry = " (and the registry's)" if self.registry is not None else ""
        return (
            f"{self.source}: ok: {len(self.tenants)} tenants{registry}, "
            f"{len(self.backends)} backends, "
            f"{models} models, active namespace key {self.gateway.active_key.id}"
        )
