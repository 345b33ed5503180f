"""The tenant registry in the Redis the gateway replicas share (`registry.store: redis`), the
twin of `local_registry`: the document, a plain version counter for compare-and-set, and a
sealed head (`gateway.fleet.sealed`) naming the version and the document's SHA-256.

Invariant: a document is believed only when the head opens under the gateway's registry key
(derived from the API key pepper, so a namespace key rotation leaves it readable), its digest
matches the document and its version is not below the newest this process has seen: whoever can
write to Redis cannot add a tenant or a key, bring back a revoked key by replaying an older
document to a running worker, or change anything unnoticed. What does not open is unknown: the
worker keeps what it had (a new worker then has no registry tenants: fail closed). A change is
one compare-and-set script, so replicas never overwrite each other's changes.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from typing import Final, TypeVar

import orjson

from gateway.fleet.sealed import Sealer
from gateway.fleet.store import SharedStore
from gateway.fleet.unavailable import SharedUnavailable
from gateway.policy.registry import Document, RegistryError, decode, empty_document, encode

T = TypeVar("T")
FIELD: Final = "registry"
TRIES: Final = 8

# KEYS: version, head, document. ARGV: expected version, new version, head, document.
_PUT: Final = """
local v = redis.call('GET', KEYS[1]) or '0'
if v ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('SET', KEYS[2], ARGV[3])
redis.call('SET', KEYS[3], ARGV[4])
return 1
"""


def registry_sealer(pepper: bytes) -> Sealer:
    return Sealer(hmac.new(pepper, b"kvfence registry v1", hashlib.sha256).digest())


class RedisRegistryStore:
    kind = "redis"

    def __init__(self, store: SharedStore, pepper: bytes) -> None:
        self.store = store
        self._sealer = registry_sealer(pepper)
        self._keys = [store.key("registry", n) for n in ("version", "head", "document")]
        self._put = store.client.register_script(_PUT)
        self._seen = -1  # the newest version this process believed

    async def _head(self) -> tuple[int, str] | None:
        """(version, sha256) from the sealed head; (0, "") when none was ever written; None
        when one is there but does not open."""
        raw = _bytes(await self.store.call("registry_read", self.store.client.get(self._keys[1])))
        if raw is None:
            return 0, ""
        opened = self._sealer.open(self._keys[1], FIELD, raw)
        if opened is None:
            return None
        head = orjson.loads(opened.value)
        return int(head["version"]), str(head["sha256"])

    async def _read(self) -> Document | None:
        head = await self._head()
        if head is None:
            return None
        version, digest = head
        if version == 0:
            return empty_document()
        raw = _bytes(await self.store.call("registry_read", self.store.client.get(self._keys[2])))
        if raw is None or not hmac.compare_digest(hashlib.sha256(raw).hexdigest(), digest):
            return None
        doc = decode(raw, "the shared registry")
        return doc if doc["version"] == version else None

    async def changed(self) -> Document | None:
        """The document when a newer one than this process believed is in Redis. Raises
        `SharedUnavailable` when Redis cannot answer, RegistryError when what it holds does not
        open or is older than a version this process has seen (the caller keeps what it has)."""
        head = await self._head()
        if head is not None and head[0] == self._seen:
            return None
        doc = await self._read()
        if doc is None or doc["version"] < self._seen:
            raise RegistryError(
                "the shared registry in Redis does not open, or is older than one seen: refused"
            )
        self._seen = doc["version"]
        return doc

    async def update(self, change: Callable[[Document], T]) -> T:
        """Apply `change` to the current document and store it (one version up), retried when
        another replica changed it meanwhile."""
        for _ in range(TRIES):
            doc = await self._read()
            if doc is None or doc["version"] < self._seen:  # never build on a forgery or replay
                raise RegistryError(
                    "the shared registry in Redis does not open, or is older than one seen"
                )
            result = change(doc)
            old = doc["version"]
            doc["version"] = old + 1
            raw = encode(doc)
            head = orjson.dumps({"version": old + 1, "sha256": hashlib.sha256(raw).hexdigest()})
            sealed = self._sealer.seal(self._keys[1], FIELD, head)
            args: list[str | bytes] = [str(old), str(old + 1), sealed, raw]
            if await self.store.call("registry_write", self._put(keys=self._keys, args=args)):
                return result
        raise RegistryError("the shared registry kept changing under this change: retry")

    async def close(self) -> None:
        return None


def _bytes(value: bytes | str | None) -> bytes | None:
    return value.encode() if isinstance(value, str) else value


__all__ = ["RedisRegistryStore", "SharedUnavailable", "registry_sealer"]
