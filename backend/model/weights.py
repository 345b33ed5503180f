"""Assembles a Llama from tensors named as in Hugging Face checkpoints, and back.

Invariant: both loaders hand over the same canonical (Hugging Face) names and layouts, so the
model is built in exactly one place; a missing or misshapen tensor is a ModelLoadError.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from backend.model.config import ModelConfig
from backend.model.errors import ModelLoadError
from backend.model.llama import LayerWeights, Llama

_LAYER = "model.layers.{}."


def build_llama(
    config: ModelConfig,
    tensors: Mapping[str, torch.Tensor],
    device: torch.device,
    dtype: torch.dtype,
) -> Llama:
    """tensors: Hugging Face names -> weights (any float dtype, any device); matrices of the
    decoder layers are converted to `dtype`."""

    def take(name: str, shape: tuple[int, ...], exact: bool = False) -> torch.Tensor:
        if name not in tensors:
            raise ModelLoadError(f"tensor {name} is missing")
        t = tensors[name]
        if tuple(t.shape) != shape:
            raise ModelLoadError(f"tensor {name} has shape {tuple(t.shape)}, expected {shape}")
        return t.to(device=device, dtype=torch.float32 if exact else dtype)

    c = config
    layers = []
    for i in range(c.n_layers):
        p = _LAYER.format(i)
        q = take(p + "self_attn.q_proj.weight", (c.q_size, c.hidden))
        k = take(p + "self_attn.k_proj.weight", (c.kv_size, c.hidden))
        v = take(p + "self_attn.v_proj.weight", (c.kv_size, c.hidden))
        gate = take(p + "mlp.gate_proj.weight", (c.ffn, c.hidden))
        up = take(p + "mlp.up_proj.weight", (c.ffn, c.hidden))
        layers.append(
            LayerWeights(
                attn_norm=take(p + "input_layernorm.weight", (c.hidden,), exact=True),
                qkv=torch.cat((q, k, v)).contiguous(),
                o=take(p + "self_attn.o_proj.weight", (c.hidden, c.q_size)),
                ffn_norm=take(p + "post_attention_layernorm.weight", (c.hidden,), exact=True),
                gate_up=torch.cat((gate, up)).contiguous(),
                down=take(p + "mlp.down_proj.weight", (c.hidden, c.ffn)),
            )
        )
    # Embedding, head and norms stay float32 whatever the dtype (see backend.model.llama).
    embed = take("model.embed_tokens.weight", (c.vocab, c.hidden), exact=True)
    lm_head = None
    if not c.tie_embeddings:
        lm_head = take("lm_head.weight", (c.vocab, c.hidden), exact=True)
    return Llama(c, embed, layers, take("model.norm.weight", (c.hidden,), exact=True), lm_head)


def to_hf_tensors(model: Llama) -> dict[str, torch.Tensor]:
    """The model's weights under Hugging Face names (fused matrices split again), on the CPU."""
    c = model.config
    out: dict[str, torch.Tensor] = {"model.embed_tokens.weight": model.embed}
    for i, w in enumerate(model.layers):
        p = _LAYER.format(i)
        q, k, v = torch.split(w.qkv, [c.q_size, c.kv_size, c.kv_size])
        gate, up = torch.split(w.gate_up, [c.ffn, c.ffn])
        out |= {
            p + "self_attn.q_proj.weight": q,
            p + "self_attn.k_proj.weight": k,
            p + "self_attn.v_proj.weight": v,
            p + "self_attn.o_proj.weight": w.o,
            p + "mlp.gate_proj.weight": gate,
            p + "mlp.up_proj.weight": up,
            p + "mlp.down_proj.weight": w.down,
            p + "input_layernorm.weight": w.attn_norm,
            p + "post_attention_layernorm.weight": w.ffn_norm,
        }
    out["model.norm.weight"] = model.norm
    if not c.tie_embeddings:
        out["lm_head.weight"] = model.lm_head
    return {name: t.detach().cpu().contiguous() for name, t in out.items()}
