"""The Llama decoder: GQA attention, rotary embeddings (rotate-half), RMSNorm, SwiGLU, tied
embeddings. Attention over the KV pool is delegated to the caller, so this module owns only math.

Invariant: Q/K weights here are in rotate-half layout (GGUF's interleaved layout is undone by
the loader), and QKV and gate/up are fused along the output dimension. Matrices run in the model
dtype; the residual stream, norms and embedding stay float32, and the top logits are exact
float32 (a bfloat16 logit cannot separate candidates closer than 0.125; SmolLM2's reference
answer is decided by 0.08). Every other op works row by row, so a row's bits depend on its
batch-mates only through the projections and the attention, which keep them apart.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from backend.model import native
from backend.model.activation import SwiGLU
from backend.model.config import ModelConfig
from backend.model.linear import Projection, RowPlanner
from backend.model.native_decode import DecodeAttention, DecodeLayers
from backend.model.native_rows import RowOps

REFINE_K = 16


class Attention(Protocol):
    """Stores the new K/V of one layer and returns the attended values.

    q: [T, Hq, D], k and v: [T, Hkv, D] (already rotated) -> [T, Hq * D]

    `decodes`: the step's first rows our own kernel attends (or None); a model that runs those
    rows itself passes `prompt` only the rows after them."""

    decodes: DecodeAttention | None

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor: ...

    def prompt(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor: ...


@dataclass(frozen=True, slots=True)
class LayerWeights:
    attn_norm: torch.Tensor  # [H] fp32
    qkv: torch.Tensor  # [q_size + 2 * kv_size, H]
    o: torch.Tensor  # [H, q_size]
    ffn_norm: torch.Tensor  # [H] fp32
    gate_up: torch.Tensor  # [2 * F, H]
    down: torch.Tensor  # [H, F]


@dataclass(frozen=True, slots=True)
class _LayerProjections:
    qkv: Projection
    o: Projection
    gate_up: Projection
    down: Projection


class Llama:
    """Inference-only decoder over packed tokens (no batch dimension: [T] token ids)."""

    def __init__(
        self,
        config: ModelConfig,
        embed: torch.Tensor,
        layers: list[LayerWeights],
        norm: torch.Tensor,
        lm_head: torch.Tensor | None,
    ) -> None:
        self.config = config
        self.embed = embed  # [V, H] fp32
        self.layers = layers
        self.norm = norm  # [H] fp32
        self.lm_head = embed if lm_head is None else lm_head  # [V, H] fp32
        self.device = embed.device
        self.dtype = layers[0].qkv.dtype
        planner = RowPlanner()
        # A float32 [V, H] product is 4x slower than bfloat16 at batch 8 on the CPU: project in
        # the model dtype, then recompute the few top candidates exactly.
        self._head = Projection(self.lm_head.to(self.dtype), planner, prompt=False)
        self._refine = self.dtype != torch.float32
        self._proj = [
            _LayerProjections(
                Projection(w.qkv, planner),
                Projection(w.o, planner),
                Projection(w.gate_up, planner),
                Projection(w.down, planner),
            )
            for w in layers
        ]
        self._swiglu = SwiGLU(config.ffn, self.dtype, self.device)
        self._cos, self._sin = _rope_tables(config, self.device)
        self._own = self._own_layers()
        # With our layers for generated rows, prompt rows' norms, rotary and SwiGLU are ours too.
        self._rows = None if self._own is None else RowOps(config, self._cos, self._sin)

    def _own_layers(self) -> DecodeLayers | None:
        """Whole layers for generated rows in our kernels, where every projection is ours."""
        if not all(p.native for p in self.projections().values()):
            return None
        if not native.attends(self.config.head_dim, self.dtype, self.device):
            return None
        weights = [(w.attn_norm, w.ffn_norm, w.qkv, w.o, w.gate_up, w.down) for w in self.layers]
        return DecodeLayers(self.config, weights, self._cos, self._sin)

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: [T] -> cos, sin: [T, 1, D] in the model dtype; sin's first half is negated
        (rotate-half's sign), so q * cos + roll(q, D/2) * sin rotates q."""
        cos = self._cos.index_select(0, positions).to(self.dtype).unsqueeze(1)
        sin = self._sin.index_select(0, positions).to(self.dtype).unsqueeze(1)
        return cos, sin

    def row_plans(self) -> str:
        """How the projections feed their kernels on this host (for the start-up log)."""
        projections = self.projections()
        plans = [
            f"{name}: {proj.plan.describe()}{', our kernel' if proj.native else ''}"
            for name, proj in projections.items()
        ]
        why = native.unavailable()
        if why and self.device.type == "cpu" and self.dtype == torch.bfloat16:
            plans.append(f"our kernel for generated rows: not used ({why})")
        if self._own is not None:
            plans.append("generated rows: whole layers in our kernels")
        return "; ".join([*plans, self._swiglu.describe()])

    def projections(self) -> dict[str, Projection]:
        """One projection of each kind (a kernel is chosen by shape, so one stands for all)."""
        p = self._proj[0]
        return {"qkv": p.qkv, "o": p.o, "gate_up": p.gate_up, "down": p.down, "head": self._head}

    def decode_weight_bytes(self) -> int:
        """Bytes of weights one decode step reads at batch 1: every projection as its kernel
        holds it and the logits head (the embedding row, norms and the head's exact top rows
        are a few kilobytes)."""
        projections = [q for p in self._proj for q in (p.qkv, p.o, p.gate_up, p.down)]
        return sum(q.weight_bytes() for q in (*projections, self._head))

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attention: Attention,
        logits_index: torch.Tensor | None = None,
        generated: int = 0,
    ) -> torch.Tensor:
        """input_ids, positions: [T]; logits_index: [N] rows to project -> logits [N, V] (fp32);
        the first `generated` rows are tokens the model generated, the rest prompt tokens.

        Without logits_index every row is projected ([T, V])."""
        cfg = self.config
        x = self.embed.index_select(0, input_ids)  # [T, H] fp32 residual stream
        own, decodes = self._own, attention.decodes
        if own is None or decodes is None:
            self._layers(x, positions, attention, generated)
        elif decodes.rows != generated:
            raise ValueError(f"{decodes.rows} decodes for {generated} generated rows")
        elif generated == x.shape[0]:  # decodes alone (most steps): every layer in one call
            own(x, 0, len(self.layers), decodes)
        else:  # each layer: the prompt rows first, whose K/V a recomputed sequence's decodes read
            mine, rest = x[:generated], x[generated:]
            self._layers(
                rest, positions[generated:], attention.prompt, 0,
                lambda i: own(mine, i, i + 1, decodes),
            )  # fmt: skip
        if logits_index is not None:
            x = x[logits_index]
        x = F.rms_norm(x, (cfg.hidden,), self.norm, cfg.rms_eps)
        return self.logits(x)

    def _layers(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        attend: Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
        generated: int,
        after: Callable[[int], None] | None = None,
    ) -> None:
        """Every layer over rows x ([T, H] float32, updated in place) at `positions`; `after(i)`
        runs once layer i is done."""
        cfg, dt, t = self.config, self.dtype, x.shape[0]
        if self._rows is not None:
            self._own_row_layers(self._rows, x, positions, attend, generated, after)
            return
        cos, sin = self.rope(positions)
        n_qk = cfg.n_heads + cfg.n_kv_heads
        half = cfg.head_dim // 2
        for i, (w, p) in enumerate(zip(self.layers, self._proj, strict=True)):
            h = F.rms_norm(x, (cfg.hidden,), w.attn_norm, cfg.rms_eps).to(dt)
            qkv = p.qkv(h, generated)  # [T, q_size + 2 kv_size]
            qk = qkv[:, : cfg.q_size + cfg.kv_size].view(t, n_qk, cfg.head_dim)
            qk = qk * cos + qk.roll(half, -1) * sin  # [T, Hq + Hkv, D], rotate-half
            q = qk[:, : cfg.n_heads]
            k = qk[:, cfg.n_heads :]
            v = qkv[:, cfg.q_size + cfg.kv_size :].view(t, cfg.n_kv_heads, cfg.head_dim)
            x.add_(p.o(attend(i, q, k, v), generated))  # x is this step's own tensor
            h = F.rms_norm(x, (cfg.hidden,), w.ffn_norm, cfg.rms_eps).to(dt)
            x.add_(p.down(self._swiglu(p.gate_up(h, generated)), generated))
            if after is not None:
                after(i)

    def _own_row_layers(
        self,
        rows: RowOps,
        x: torch.Tensor,
        positions: torch.Tensor,
        attend: Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
        generated: int,
        after: Callable[[int], None] | None,
    ) -> None:
        """`_layers` with the products in their kernels and every other op of a row in ours."""
        cfg, t = self.config, x.shape[0]
        ends = rows.ends(positions)  # checked once, not per layer
        kv_at = cfg.q_size + cfg.kv_size
        for i, (w, p) in enumerate(zip(self.layers, self._proj, strict=True)):
            qkv = p.qkv(rows.rms_norm(x, w.attn_norm), generated).contiguous()
            rows.rope_(qkv, ends)
            q = qkv[:, : cfg.q_size].view(t, cfg.n_heads, cfg.head_dim)
            k = qkv[:, cfg.q_size : kv_at].view(t, cfg.n_kv_heads, cfg.head_dim)
            v = qkv[:, kv_at:].view(t, cfg.n_kv_heads, cfg.head_dim)
            x.add_(p.o(attend(i, q, k, v), generated))
            gate_up = p.gate_up(rows.rms_norm(x, w.ffn_norm), generated).contiguous()
            x.add_(p.down(rows.swiglu(gate_up), generated))
            if after is not None:
                after(i)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """x: [N, H] fp32 final hidden states -> [N, V] fp32; the top REFINE_K are exact.
        Every row is run as a generated row: a row's logits are the same wherever it came from."""
        rows = x.shape[0]
        if not self._refine:
            return self._head(x, rows)
        approx = self._head(x.to(self.dtype), rows).float()
        top = approx.topk(min(REFINE_K, approx.shape[-1]), dim=-1).indices  # [N, K]
        exact = (self.lm_head[top] * x.unsqueeze(1)).sum(dim=-1)  # [N, K], per-row sums
        return approx.scatter_(1, top, exact)

    def forward_dense(self, input_ids: torch.Tensor | list[int]) -> torch.Tensor:
        """One sequence without a KV pool (reference path): input_ids [S] -> logits [S, V]."""
        ids = torch.as_tensor(input_ids, device=self.device)
        positions = torch.arange(ids.shape[0], device=self.device)
        return self.forward(ids, positions, DenseCausalAttention(self.config.group))


class DenseCausalAttention:
    """Causal attention over one whole sequence, no cache: the reference for the paged path."""

    decodes: DecodeAttention | None = None

    def __init__(self, group: int) -> None:
        self.group = group

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        # q: [S, Hq, D]; k, v: [S, Hkv, D]
        k = k.repeat_interleave(self.group, dim=1)
        v = v.repeat_interleave(self.group, dim=1)
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True
        )  # [Hq, S, D]
        return out.transpose(0, 1).reshape(q.shape[0], -1)

    def prompt(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self(layer, q, k, v)


def _rope_tables(config: ModelConfig, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin: [max_positions, D] in fp32, halves duplicated for rotate-half, and sin's first
    half negated: (-x2 * s, x1 * s) is roll(x) * (-s, s) exactly, a sign flip being exact."""
    d = config.head_dim
    inv_freq = 1.0 / (
        config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64, device=device) / d)
    )
    pos = torch.arange(config.max_positions, dtype=torch.float64, device=device)
    angles = torch.outer(pos, inv_freq)  # [P, D/2]
    angles = torch.cat((angles, angles), dim=-1)  # [P, D]
    sin = angles.sin()
    sin[:, : d // 2].neg_()
    return angles.cos().float(), sin.float()
