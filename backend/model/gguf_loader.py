"""Loads a llama-architecture GGUF file: metadata -> ModelConfig, tensors dequantized with the
`gguf` package and renamed to Hugging Face names, vocabulary -> Tokenizer.

Invariant: attn_q / attn_k come out in rotate-half layout (llama.cpp's interleaved rotary
permutation is inverted here); anything unreadable is a ModelLoadError.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch

from backend.model.config import ModelConfig
from backend.model.errors import ModelLoadError
from backend.model.tokenizer import Tokenizer

SUPPORTED_ARCHITECTURES = ("llama",)
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


class GGUFFile:
    """An opened GGUF file with typed access to its metadata."""

    def __init__(self, path: Path) -> None:
        self.path = path
        if not path.is_file():
            raise ModelLoadError(f"{path}: no such model file")
        with path.open("rb") as f:
            if f.read(4) != b"GGUF":
                raise ModelLoadError(f"{path}: not a GGUF file (bad magic)")
        try:
            self.reader = gguf.GGUFReader(str(path))
        except Exception as exc:  # gguf raises assorted ValueError/IndexError/struct errors
            raise ModelLoadError(f"{path}: corrupt or truncated GGUF file ({exc})") from exc

    def get(self, key: str, default: Any = None) -> Any:
        field = self.reader.fields.get(key)
        return default if field is None else field.contents()

    def require(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise ModelLoadError(f"{self.path}: metadata key {key} is missing")
        return value


def read_config(g: GGUFFile) -> ModelConfig:
    arch = g.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(
            f"{g.path}: unsupported architecture {arch!r} (supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    hidden = int(g.require(f"{arch}.embedding_length"))
    n_heads = int(g.require(f"{arch}.attention.head_count"))
    names = {t.name for t in g.reader.tensors}
    eos = g.get("tokenizer.ggml.eos_token_id")
    eot = g.get("tokenizer.ggml.eot_token_id")
    eos_ids = tuple(dict.fromkeys(int(i) for i in (eos, eot) if i is not None))
    bos = g.get("tokenizer.ggml.bos_token_id")
    return ModelConfig(
        n_layers=int(g.require(f"{arch}.block_count")),
        hidden=hidden,
        n_heads=n_heads,
        n_kv_heads=int(g.get(f"{arch}.attention.head_count_kv", n_heads)),
        head_dim=int(g.get(f"{arch}.rope.dimension_count", hidden // n_heads)),
        ffn=int(g.require(f"{arch}.feed_forward_length")),
        vocab=len(g.require("tokenizer.ggml.tokens")),
        rope_theta=float(g.get(f"{arch}.rope.freq_base", 10000.0)),
        rms_eps=float(g.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        tie_embeddings="output.weight" not in names,
        max_positions=int(g.get(f"{arch}.context_length", 2048)),
        bos_id=None if bos is None else int(bos),
        eos_ids=eos_ids,
    )


def read_tensors(g: GGUFFile, config: ModelConfig) -> dict[str, torch.Tensor]:
    """All weights, dequantized to fp32, under Hugging Face names."""
    out: dict[str, torch.Tensor] = {}
    for t in g.reader.tensors:
        name = _hf_name(t.name)
        if name is None:
            continue
        try:
            array = gguf.quants.dequantize(t.data, t.tensor_type)
        except (ValueError, NotImplementedError, IndexError) as exc:
            raise ModelLoadError(f"{g.path}: cannot dequantize {t.name}: {exc}") from exc
        weight = torch.from_numpy(np.array(array, dtype=np.float32, copy=True))
        if name.endswith("q_proj.weight"):
            weight = unpermute_rotary(weight, config.n_heads)
        elif name.endswith("k_proj.weight"):
            weight = unpermute_rotary(weight, config.n_kv_heads)
        out[name] = weight
    return out


def read_tokenizer(g: GGUFFile, config: ModelConfig) -> Tokenizer:
    tokenizer_model = g.get("tokenizer.ggml.model")
    if tokenizer_model != "gpt2":
        raise ModelLoadError(
            f"{g.path}: unsupported tokenizer model {tokenizer_model!r} (supported: gpt2)"
        )
    return Tokenizer.from_gguf_vocab(
        tokens=g.require("tokenizer.ggml.tokens"),
        merges=g.require("tokenizer.ggml.merges"),
        token_types=g.require("tokenizer.ggml.token_type"),
        pre=str(g.get("tokenizer.ggml.pre", "gpt2")),
        bos_id=config.bos_id,
        eos_ids=config.eos_ids,
        chat_template=g.get("tokenizer.chat_template"),
    )


def unpermute_rotary(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row permutation: within each head, rows interleaved as pairs
    (0, D/2, 1, D/2+1, ...) go back to two halves. weight: [n_heads * D, H]."""
    rows, cols = weight.shape
    w = weight.reshape(n_heads, rows // n_heads // 2, 2, cols)
    return w.transpose(1, 2).reshape(rows, cols).contiguous()


def _hf_name(name: str) -> str | None:
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    return None
