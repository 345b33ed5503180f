"""The policy's backends, as frozen dataclasses: what each serves, how it is scoped and how its
answers are verified (`gateway.policy.backends` and `gateway.policy.verify` read them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from gateway.policy.secrets import Secret, SecretRef
from kvfence.keys.keyfile import TrustStore


class AuditMode(StrEnum):
    ENFORCE = "enforce"
    MONITOR = "monitor"


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
    namespace A (the second must hit) and once in B (must not), in a shape that varies (and,
    for a round a tenant's answer triggered, copies that request's); by first-token time with
    the probe's sequential test when the cached-token count cannot decide."""

    interval_s: float = 300.0
    prompt_tokens: int = 384
    on_shared: OnShared = OnShared.QUARANTINE
    clean_rounds: int = 3  # clean rounds in a row that release a quarantine
    jitter: float = 0.5  # a round is due after interval_s times a uniform draw in 1 +- jitter
    timing_budget: int = 20  # timing mode: paired procedures per arm at most (looks: 10, 15, 20)
    timing_alpha: float = 1e-4  # timing mode: a round's false-`shared` rate (confirmed: squared)
    trigger_interval_s: float = 60.0  # a tenant's answers trigger at most one round this often
    max_share: float = 0.05  # triggered rounds' requests, as a share of tenant requests


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
    weight: float = 1.0  # its share of a model's namespaces among the model's backends
