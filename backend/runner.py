"""Executes step plans on the loaded model over the paged KV pool: one forward pass per step
for every chunk, prefill and decode together; steps of decodes alone from static buffers (CUDA
graphs on a GPU, backend.model.decode_graphs).

Invariant: the KV pool is written only at the slots of a plan's chunks, after the plan's
zero_blocks have been zeroed, and at the scratch blocks past the engine's (padding rows);
every tensor lives on `runner.device`. A step's tokens are read back to the host once.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from backend.engine.plan import Chunk, StepPlan, StepResult, TokenLogprobs
from backend.model import paged_gpu
from backend.model.decode_graphs import DecodeGraphs, decodes_alone, scratch_blocks
from backend.model.kv_pool import KVPool
from backend.model.load import LoadedModel
from backend.model.logprobs import token_logprobs
from backend.model.sampler import sample
from backend.model.step_inputs import build_step_inputs, validate_chunk


class ModelRunner:
    """Implements backend.engine.plan.Runner."""

    def __init__(
        self,
        loaded: LoadedModel,
        num_blocks: int,
        block_size: int = 16,
        max_batch: int = 256,
        graphs: bool | None = None,
    ) -> None:
        """`graphs`: steps of decodes alone (up to `max_batch`) from static buffers, captured as
        CUDA graphs on a GPU; None (the default): on a GPU whose decode attention is ours."""
        if num_blocks < 1 or block_size < 1 or max_batch < 1:
            raise ValueError("num_blocks, block_size and max_batch must be positive")
        self.loaded = loaded
        self.model = loaded.model
        self.device = loaded.device
        self.dtype = loaded.dtype
        self.num_blocks = num_blocks
        self.block_size = block_size
        wanted = _by_default(self.device) if graphs is None else graphs
        # With static buffers the pool has blocks past the engine's: the padding rows' scratch.
        blocks = num_blocks + (scratch_blocks(max_batch, block_size) if wanted else 0)
        self.pool = KVPool(loaded.config, blocks, block_size, self.device, self.dtype)
        self.graphs: DecodeGraphs | None = None
        self.graphs_skipped = ""  # why steps of decodes alone run the usual way, where they do
        if wanted and (graphs or self.pool.plan.own_decodes):
            capture = self.device.type == "cuda"
            try:
                self.graphs = DecodeGraphs(self.model, self.pool, num_blocks, max_batch, capture)
            except Exception as exc:  # by default a failed capture costs speed, not the server
                if graphs:
                    raise
                self.graphs_skipped = f"CUDA graphs not used: {exc!r}"[:300]
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)  # nothing of the capture in flight
        elif wanted and graphs is None:
            self.graphs_skipped = "CUDA graphs not used: decodes are not read in place"
        self._generator = torch.Generator(device=self.device)
        self._generator.seed()

    @property
    def k_cache(self) -> list[torch.Tensor]:
        """Per layer: [num_blocks, block_size, n_kv_heads, head_dim]."""
        return self.pool.k_cache

    @property
    def v_cache(self) -> list[torch.Tensor]:
        return self.pool.v_cache

    def kernel_plans(self) -> str:
        """How this host's kernels are fed so that a row never depends on its batch-mates."""
        plans = f"{self.model.row_plans()}; {self.pool.plan.describe()}"
        if self.device.type == "cuda" and not self.pool.plan.own_decodes:
            cfg = self.loaded.config
            why = paged_gpu.checked(
                self.device, self.dtype, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
            )  # remembered from the pool's plan: no second probe
            plans += f"; our decode attention: not used ({why})"
        if self.graphs is None:
            return f"{plans}; {self.graphs_skipped}" if self.graphs_skipped else plans
        sizes = len(self.graphs.sizes)
        return f"{plans}; steps of decodes alone: {self.decode_steps} of {sizes} sizes"

    @property
    def decode_steps(self) -> str:
        """How steps of decodes alone run: "CUDA graphs", "static buffers" or "usual path"."""
        if self.graphs is None:
            return "usual path"
        return "CUDA graphs" if self.graphs.captured else "static buffers"

    def kv_cache_bytes(self) -> int:
        """Bytes held by the KV pool (K and V, all layers)."""
        return self.pool.nbytes()

    def zero_blocks(self, ids: tuple[int, ...] | list[int]) -> None:
        if not ids:
            return
        if any(b < 0 or b >= self.num_blocks for b in ids):
            raise ValueError("block id outside the pool")
        self.pool.zero_blocks(torch.tensor(list(ids), device=self.device))

    def execute(self, plan: StepPlan) -> StepResult:
        """Run one step; a token for every chunk with `sample`, logprobs where asked."""
        limit = self.loaded.config.max_positions
        for chunk in plan.chunks:
            validate_chunk(chunk, self.block_size, self.num_blocks, limit)
        with torch.inference_mode():
            self.zero_blocks(plan.zero_blocks)
            if not plan.chunks:
                return StepResult({})
            graphs = self.graphs
            if graphs is not None and graphs.holds(len(plan.chunks)) and decodes_alone(plan.chunks):
                return self._sample(graphs.logits(plan.chunks), plan.chunks)
            inputs = build_step_inputs(
                plan.chunks,
                self.block_size,
                self.loaded.config.group,
                self.pool.plan,
                self.device,
            )
            attention = self.pool.attention(inputs.slots, inputs.groups)
            logits = self.model.forward(
                inputs.input_ids,
                inputs.positions,
                attention,
                inputs.logits_index,
                inputs.generated,
            )
            if not inputs.sampled:
                return StepResult({})
            return self._sample(logits, inputs.sampled)

    def _sample(self, logits: torch.Tensor, sampled: Sequence[Chunk]) -> StepResult:
        """logits: [N, V] fp32, row i for sampled[i] -> their tokens (one read back) and the
        logprobs asked for."""
        tokens = sample(
            logits,
            [c.sampling for c in sampled],
            [c.num_generated for c in sampled],
            self._generator,
        )
        chosen = dict(zip([c.seq_id for c in sampled], tokens, strict=True))
        return StepResult(chosen, _logprobs(logits, sampled, tokens))


def _by_default(device: torch.device) -> bool:
    """Whether steps of decodes alone run from static buffers unless asked otherwise: on a GPU,
    where they are CUDA graphs (on a CPU they gain nothing measurable: bench/README.md)."""
    return device.type == "cuda"


def _logprobs(
    logits: torch.Tensor, sampled: Sequence[Chunk], tokens: Sequence[int]
) -> dict[int, TokenLogprobs]:
    """logits: [N, V] fp32, one row per sampled chunk -> logprobs of the chunks that asked."""
    asked = [i for i, c in enumerate(sampled) if c.sampling.logprobs is not None]
    if not asked:
        return {}
    rows = logits[torch.tensor(asked, device=logits.device)]  # [M, V]
    tops = [sampled[i].sampling.logprobs or 0 for i in asked]
    found = token_logprobs(rows, [tokens[i] for i in asked], tops)
    return {sampled[i].seq_id: lp for i, lp in zip(asked, found, strict=True)}
