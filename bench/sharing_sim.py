"""The hit-rate simulation behind bench/sharing.py: request traces replayed, one request at a
time, through our backend's real block pool and block hashes (`BlockPool`, `chain_hashes`), under
three sharing modes: global (one namespace), isolated (one per tenant) and public (one per
tenant, with the declared shared prefix in a public namespace of its own).

Invariant: a pool block stands for one trace block (`tokens_per_block` tokens; its one token is
the block's id), so block hashes chain and hits break exactly where the engine's would: only
full blocks are cached, and the block that holds a prompt's last token is always recomputed.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from backend.engine.block_pool import BlockPool
from backend.engine.prefix_cache import chain_hashes
from kvfence.capability import Namespace, _mint
from kvfence.public import PUBLIC_GROUP

MODES = ("global", "isolated", "public")


@dataclass(frozen=True, slots=True)
class Request:
    tenant: str
    blocks: tuple[int, ...]  # the ids of the prompt's consecutive trace blocks
    tokens: int  # prompt length in tokens
    public: int  # leading blocks that are the declared public prefix


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    tokens_per_block: int
    requests: tuple[Request, ...]
    constrained: int  # pool blocks (of tokens_per_block) in the constrained case

    @property
    def distinct_blocks(self) -> int:
        return len({b for r in self.requests for b in r.blocks})


@dataclass(frozen=True, slots=True)
class Outcome:
    prompt_tokens: int
    hit_tokens: int

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def mooncake(path: Path, pool_blocks: int = 5000) -> Workload:
    """The Mooncake conversation trace: 512-token blocks; a request starting with block 0 (the
    common system prompt) belongs to the conversation its second block names, each conversation
    a tenant; block 0 is the declared public prefix."""
    requests = []
    for number, line in enumerate(path.read_text().splitlines()):
        row = json.loads(line)
        ids = tuple(row["hash_ids"])
        shared = ids[0] == 0
        tenant = str(ids[1]) if shared and len(ids) > 1 else f"alone-{number}"
        requests.append(Request(tenant, ids, int(row["input_length"]), 1 if shared else 0))
    return Workload("mooncake", 512, tuple(requests), pool_blocks)


def synthetic(
    tenants: int = 64,
    system_blocks: int = 8,
    conversations: int = 2,
    turns: int = 4,
    turn_blocks: int = 3,
    block_size: int = 16,
    seed: int = 0,
) -> Workload:
    """N tenants x one shared system prompt of `system_blocks` blocks x private suffixes: each
    tenant's conversations grow by `turn_blocks` blocks (plus a partial one) a turn; requests
    of all tenants interleaved at random. The constrained pool holds a third of the blocks."""
    rng = random.Random(seed)
    system = tuple(range(system_blocks))
    fresh = iter(range(system_blocks, 1 << 40))
    queues = []
    for t in range(tenants):
        for _ in range(conversations):
            history: tuple[int, ...] = ()
            convo = []
            for _ in range(turns):
                history += tuple(next(fresh) for _ in range(turn_blocks))
                blocks = system + history + (next(fresh),)  # the last block is partial
                tokens = (len(blocks) - 1) * block_size + block_size // 2
                convo.append(Request(f"tenant-{t}", blocks, tokens, system_blocks))
            queues.append(convo)
    requests = []
    while queues:
        convo = rng.choice(queues)
        requests.append(convo.pop(0))
        if not convo:
            queues.remove(convo)
    workload = Workload("synthetic", block_size, tuple(requests), 0)
    return Workload(workload.name, block_size, workload.requests, workload.distinct_blocks // 3)


class Simulation:
    """One pool, one mode: `serve` replays a request as the scheduler would (hits on the longest
    cached chain of full blocks, fresh blocks for the rest, full blocks cached, all released)."""

    def __init__(self, mode: str, pool_blocks: int, public_floor: float = 0.25) -> None:
        if mode not in MODES:
            raise ValueError(f"mode is one of {MODES}")
        self.mode = mode
        self.pool = BlockPool(pool_blocks, 1)
        # A simulation: namespaces are minted the way the engine's tests mint them.
        self._public = _mint("public", PUBLIC_GROUP, 1.0, public_floor)
        self._shared = _mint("global")
        self._tenants: dict[str, Namespace] = {}

    def _namespace(self, tenant: str) -> Namespace:
        if self.mode == "global":
            return self._shared
        ns = self._tenants.get(tenant)
        if ns is None:
            ns = self._tenants[tenant] = _mint(f"tenant-{tenant}", f"group-{tenant}", 1.0, 0.0)
        return ns

    def _layout(self, req: Request) -> Callable[[int], Namespace]:
        own = self._namespace(req.tenant)
        if self.mode != "public" or not req.public:
            return lambda _: own
        return lambda i: self._public if i < req.public else own

    def serve(self, req: Request, tokens_per_block: int) -> int:
        """The request's hit tokens."""
        ns_at = self._layout(req)
        ids = list(req.blocks)
        hashes = chain_hashes(ns_at, ids, 1, [])
        full = req.tokens // tokens_per_block
        limit = min((req.tokens - 1) // tokens_per_block, len(ids))
        table: list[tuple[int, Namespace]] = []
        for i in range(limit):
            block_id = self.pool.lookup(ns_at(i), hashes[i], ids[i : i + 1])
            if block_id is None:
                break
            self.pool.acquire(block_id, ns_at(i))
            table.append((block_id, ns_at(i)))
        hit = len(table)
        for i in range(hit, len(ids)):
            (block_id,) = self.pool.allocate(ns_at(i), 1)
            table.append((block_id, ns_at(i)))
            if i < full:
                self.pool.cache(block_id, hashes[i], ids[i : i + 1])
        for block_id, ns in table:
            self.pool.release(block_id, ns)
        return hit * tokens_per_block


def simulate(workload: Workload, mode: str, pool_blocks: int | None) -> Outcome:
    """Replay `workload` in `mode` (pool_blocks None: unlimited, nothing is ever evicted)."""
    size = pool_blocks or sum(len(r.blocks) for r in workload.requests)
    sim = Simulation(mode, size)
    prompt = hits = 0
    for req in workload.requests:
        prompt += req.tokens
        hits += sim.serve(req, workload.tokens_per_block)
    if size <= 4096:  # the pool's own integrity check grows with blocks x cached blocks
        sim.pool.check_integrity()
    return Outcome(prompt, hits)


def grid(workload: Workload) -> Iterator[tuple[str, str, Outcome]]:
    """(pool, mode, outcome) for every mode at unlimited KV and at the constrained pool."""
    for label, blocks in (("unlimited", None), ("constrained", workload.constrained)):
        for mode in MODES:
            yield label, mode, simulate(workload, mode, blocks)
