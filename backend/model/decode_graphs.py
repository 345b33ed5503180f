"""Steps of decodes alone (most steps once prompts are in) run from static buffers, one set of
views per padded batch size; on CUDA each size's forward pass is captured once as a CUDA graph
and replayed, so a step costs one launch instead of a few hundred.

Invariant: a step's rows get the bits the step gets without this path: the same kernels, ops
that work row by row, projections whose row plan gives a row its bits at any call size, and
decode attention that reads each row's own context only (so the padding rows change nothing).
Padding rows read and write only the scratch blocks, which the engine never hands out. A graph
reads the buffers it was captured with: each step writes them in place, never replaces them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from backend.engine.plan import Chunk
from backend.model.kv_pool import AttnGroup, KVPool, PagedAttention
from backend.model.llama import Llama

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE

_Graph = tuple[torch.cuda.CUDAGraph, torch.Tensor]  # the graph and its output, the logits
# Padded batch sizes: a step of n decodes runs as the smallest size that holds it.
SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def decodes_alone(chunks: Sequence[Chunk]) -> bool:
    """Whether every chunk is one generated token that is sampled (a plain decode)."""
    return bool(chunks) and all(
        len(c.token_ids) == 1 and c.start >= c.prompt_len and c.sample for c in chunks
    )


class DecodeGraphs:
    """Runs decode-only steps of up to `max_batch` rows from static buffers; `capture` (CUDA
    only) records each padded size's forward pass as a graph once, at construction."""

    def __init__(self, model: Llama, pool: KVPool, scratch: int, max_batch: int, capture: bool):
        """`scratch`: the first of `scratch_blocks(max_batch, block_size)` blocks past the
        engine's. Padding row i writes slot i of them and reads only its own scratch block:
        no slot has two writers in a step, so a step of padding rows alone gives the same bits
        every time (which a graph's check needs), whatever order a device writes in."""
        if not pool.plan.own_decodes:
            raise ValueError("decode steps from static buffers need decodes read in place")
        if capture and pool.k.device.type != "cuda":
            raise ValueError("CUDA graphs are captured on a CUDA device only")
        bs = pool.block_size
        if scratch < 0 or scratch + scratch_blocks(max_batch, bs) > pool.k.shape[1]:
            raise ValueError(f"scratch blocks from {scratch} leave the pool")
        self.model, self.pool, self.scratch = model, pool, scratch
        self.sizes = (*(s for s in SIZES if s < max_batch), max_batch)
        most, dev = self.sizes[-1], pool.k.device
        width = -(-model.config.max_positions // bs)
        # Padding row i: token 0 at position i % bs of scratch block i // bs.
        self._pad = [(scratch + i // bs, i % bs) for i in range(most)]
        self._rows = torch.tensor(  # ids, positions, slots
            [[0] * most, [p for _, p in self._pad], [b * bs + p for b, p in self._pad]],
            device=dev,
        )
        self._ends = torch.tensor([p + 1 for _, p in self._pad], dtype=torch.int32, device=dev)
        self._blocks = torch.tensor([[b] * width for b, _ in self._pad], dtype=torch.int32)
        self._blocks = self._blocks.to(dev)
        self._graphs: dict[int, _Graph] = {}
        if capture:
            shared = torch.cuda.graph_pool_handle()
            for size in reversed(self.sizes):  # the largest first: the others fit in its memory
                self._graphs[size] = self._capture(size, shared)

    @property
    def captured(self) -> bool:
        return bool(self._graphs)

    def holds(self, rows: int) -> bool:
        return rows <= self.sizes[-1]

    def logits(self, chunks: Sequence[Chunk]) -> torch.Tensor:
        """The step's logits [n, V] float32, row i for chunks[i] (a decode alone each). On a
        graph they are a view of its output: read them before the next step."""
        n = len(chunks)
        size = next(s for s in self.sizes if s >= n)
        self._fill(chunks, size)
        graph = self._graphs.get(size)
        if graph is None:
            return self._forward(self._attention(size), size)[:n]
        graph[0].replay()
        return graph[1][:n]

    def _fill(self, chunks: Sequence[Chunk], size: int) -> None:
        """Writes the step's rows, and padding rows on the scratch blocks, into the buffers."""
        bs, n = self.pool.block_size, len(chunks)
        pad = self._pad[n:size]
        ends = [c.start + 1 for c in chunks] + [p + 1 for _, p in pad]
        width = -(-max(ends) // bs)
        rows = [
            [*(c.token_ids[0] for c in chunks), *[0] * len(pad)],
            [*(c.start for c in chunks), *[p for _, p in pad]],
            [
                *(c.block_table[c.start // bs] * bs + c.start % bs for c in chunks),
                *[b * bs + p for b, p in pad],
            ],
        ]
        tables = [_padded(c.block_table[:width], width, self.scratch) for c in chunks]
        tables += [[b] * width for b, _ in pad]
        self._rows[:, :size].copy_(torch.tensor(rows))
        self._ends[:size].copy_(torch.tensor(ends, dtype=torch.int32))
        self._blocks[:size, :width].copy_(torch.tensor(tables, dtype=torch.int32))

    def _attention(self, size: int) -> PagedAttention:
        group = AttnGroup(slice(0, size), size, 1, self._blocks[:size], None, self._ends[:size])
        return self.pool.attention(self._rows[2, :size], [group])

    def _forward(self, attention: PagedAttention, size: int) -> torch.Tensor:
        ids, positions = self._rows[0, :size], self._rows[1, :size]
        return self.model.forward(ids, positions, attention, None, generated=size)

    def _capture(self, size: int, shared: _POOL_HANDLE) -> _Graph:
        """Warms the size up on a side stream (kernels compiled, workspaces made), then records
        it. The buffers hold padding rows only: warm-up and capture touch the scratch blocks."""
        attention = self._attention(size)
        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream())
        with torch.inference_mode(), torch.cuda.stream(side):
            for _ in range(2):
                self._forward(attention, size)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(graph, pool=shared):
            out = self._forward(attention, size)
        self._verify(size, graph, out)
        return graph, out

    def _verify(self, size: int, graph: torch.cuda.CUDAGraph, out: torch.Tensor) -> None:
        """Replays the graph on other token ids (one per row) and runs the same step directly:
        the bits must agree, or what the capture fixed would answer every later step."""
        ids = self._rows[0, :size]
        ids.copy_(torch.arange(1, size + 1) % self.model.config.vocab)
        try:
            graph.replay()
            replayed = out.clone()
            with torch.inference_mode():
                direct = self._forward(self._attention(size), size)
        finally:
            ids.zero_()
        if not torch.equal(replayed, direct):
            raise RuntimeError(f"the graph of {size} rows replays other bits than a direct step")


def scratch_blocks(max_batch: int, block_size: int) -> int:
    """Blocks past the engine's that padding rows of up to `max_batch` rows use."""
    return -(-max_batch // block_size)


def _padded(table: Sequence[int], width: int, fill: int) -> list[int]:
    return [*table, *[fill] * (width - len(table))]
