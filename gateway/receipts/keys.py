"""The gateway's published key set (GET /v1/kvfence/keys): the receipt keys, the active one that
signs, the retired ones that still verify what they signed, the log's key (the gateway's
identity) and the witnesses it accepts; built once per policy.

Invariant: the key set served and the key set each receipt names (its digest) are the same
object, derived from the policy the receipt's request was served under.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gateway.audit.sink import log_signer
from gateway.policy.model import AuditLogSettings, CheckpointSettings, Policy, ReceiptSettings
from kvfence.receipts.note import Verifier
from kvfence.receipts.receipt import KeySet, ReceiptKey


@dataclass(frozen=True, slots=True)
class ReceiptKeys:
    keyset: KeySet
    document: bytes  # the key set as served
    key_id: str  # the active key's
    key: Ed25519PrivateKey
    checkpoints: CheckpointSettings

    @classmethod
    def of(cls, receipts: ReceiptSettings, audit: AuditLogSettings) -> ReceiptKeys:
        checkpoints = audit.checkpoints
        assert checkpoints is not None, "the policy loader requires checkpoints for receipts"
        ordered = sorted(receipts.keys, key=lambda k: not k.active)  # the active one first
        keyset = KeySet(
            log_signer(checkpoints).verifier,
            tuple(ReceiptKey(k.id, k.key.public_key(), k.active) for k in ordered),
            tuple(Verifier.parse(v) for v in checkpoints.witnesses),
        )
        document = orjson.dumps(keyset.document(), option=orjson.OPT_INDENT_2)
        active = receipts.active
        return cls(keyset, document, active.id, active.key, checkpoints)


class KeysCache:
    """The key set of the policy in force, rebuilt only when the policy object changes."""

    __slots__ = ("_keys", "_policy")

    def __init__(self) -> None:
        self._policy: Policy | None = None
        self._keys: ReceiptKeys | None = None

    def get(self, policy: Policy) -> ReceiptKeys | None:
        if policy is not self._policy:
            receipts, audit = policy.gateway.receipts, policy.gateway.audit_log
            self._keys = (
                None if receipts is None or audit is None else ReceiptKeys.of(receipts, audit)
            )
            self._policy = policy
        return self._keys
