"""The prefix cache of the fake inference server (tests/fakes/cache_server.py): whole blocks of
"tokens" (words here) chained from the first, scoped by a salt, in a device tier and an
optional host tier that copies every block as it is stored (write-through, as SGLang's
hierarchical cache does), each least-recently-used with a capacity in blocks.

Named a fake: it models the cache behaviour the misbehaving servers below need, nothing more.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

Key = tuple[str, tuple[str, ...]]


@dataclass
class Tier:
    capacity: int
    blocks: OrderedDict[Key, None] = field(default_factory=OrderedDict)

    def has(self, key: Key) -> bool:
        if key in self.blocks:
            self.blocks.move_to_end(key)
            return True
        return False

    def put(self, key: Key) -> None:
        self.blocks[key] = None
        self.blocks.move_to_end(key)
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)


@dataclass
class PrefixCache:
    block: int = 16
    device_blocks: int = 4096
    host: str = ""  # "": no host tier; "salted"; "unsalted" (the offload tier drops the salt)
    host_blocks: int = 65536
    enabled: bool = True  # False: a model that caches nothing (hybrid / Mamba)

    def __post_init__(self) -> None:
        self.device = Tier(self.device_blocks)
        self.offload = Tier(self.host_blocks)

    def clear(self) -> None:
        self.device.blocks.clear()
        self.offload.blocks.clear()

    def lookup_and_store(self, scope: str, tokens: list[str]) -> tuple[int, int]:
        """(tokens hit on the device, tokens hit on the host) of the longest cached prefix;
        then every whole block of `tokens` is cached under `scope`."""
        if not self.enabled:
            return 0, 0
        device = host = 0
        ends = range(self.block, len(tokens) + 1, self.block)
        for end in ends:
            prefix = tuple(tokens[:end])
            if device + host == end - self.block and not host and self.device.has((scope, prefix)):
                device = end
            elif device + host == end - self.block and self.host and self._host_has(scope, prefix):
                host = end - device
            else:
                break
        for end in ends:
            prefix = tuple(tokens[:end])
            self.device.put((scope, prefix))
            if self.host:
                self.offload.put((self._host_scope(scope), prefix))
        return device, host

    def _host_scope(self, scope: str) -> str:
        return "" if self.host == "unsalted" else scope

    def _host_has(self, scope: str, prefix: tuple[str, ...]) -> bool:
        return self.offload.has((self._host_scope(scope), prefix))
