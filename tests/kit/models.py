"""The models tests and benchmarks load: a tiny random Llama (its config and weights) with a
byte-level tokenizer (every UTF-8 byte one token) for fast tests of the arithmetic, and the
device model fixtures live on."""

from __future__ import annotations

import os

import torch

from backend.model.config import ModelConfig
from backend.model.tokenizer import Tokenizer

CONTROL = 3
SPECIALS = ("<|im_end|>", "<|im_start|>", "<|pad|>", "<|pad2|>")


def gpt2_byte_alphabet() -> list[str]:
    """The printable stand-in character for each byte 0..255, in byte order (gpt2 scheme)."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def byte_tokenizer() -> Tokenizer:
    tokens = [*gpt2_byte_alphabet(), *SPECIALS]
    types = [1] * 256 + [CONTROL] * len(SPECIALS)
    return Tokenizer.from_gguf_vocab(
        tokens=tokens,
        merges=[],
        token_types=types,
        pre="gpt2",
        bos_id=None,
        eos_ids=(256,),
        chat_template=None,
    )


# Where model fixtures live: the CPU by default; KVFENCE_TEST_DEVICE=cuda runs them on a GPU.
TEST_DEVICE = torch.device(os.environ.get("KVFENCE_TEST_DEVICE", "cpu"))


TINY = ModelConfig(
    n_layers=2,
    hidden=32,
    n_heads=4,
    n_kv_heads=2,
    head_dim=8,
    ffn=48,
    vocab=260,
    rope_theta=10000.0,
    rms_eps=1e-5,
    tie_embeddings=True,
    max_positions=256,
    bos_id=None,
    eos_ids=(256,),
)


def tiny_tensors(seed: int = 0, config: ModelConfig = TINY) -> dict[str, torch.Tensor]:
    """Random weights under Hugging Face names for TINY (or another small config)."""
    gen = torch.Generator().manual_seed(seed)
    c = config
    shapes = {"model.embed_tokens.weight": (c.vocab, c.hidden), "model.norm.weight": (c.hidden,)}
    for i in range(c.n_layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (c.q_size, c.hidden),
            p + "self_attn.k_proj.weight": (c.kv_size, c.hidden),
            p + "self_attn.v_proj.weight": (c.kv_size, c.hidden),
            p + "self_attn.o_proj.weight": (c.hidden, c.q_size),
            p + "mlp.gate_proj.weight": (c.ffn, c.hidden),
            p + "mlp.up_proj.weight": (c.ffn, c.hidden),
            p + "mlp.down_proj.weight": (c.hidden, c.ffn),
            p + "input_layernorm.weight": (c.hidden,),
            p + "post_attention_layernorm.weight": (c.hidden,),
        }
    return {name: torch.randn(shape, generator=gen) * 0.5 for name, shape in shapes.items()}
