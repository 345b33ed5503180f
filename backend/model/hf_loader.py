"""Loads a Hugging Face model directory: config.json, *.safetensors, tokenizer.json and
(optionally) tokenizer_config.json for the chat template.

Invariant: only Llama-architecture configs are accepted; anything unreadable is a ModelLoadError.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from backend.model.config import ModelConfig
from backend.model.errors import ModelLoadError
from backend.model.tokenizer import Tokenizer

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM",)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ModelLoadError(f"{path}: missing") from exc
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: not readable JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path}: expected a JSON object")
    return data


def read_config(directory: Path) -> ModelConfig:
    raw = _read_json(directory / "config.json")
    archs = raw.get("architectures") or [raw.get("model_type")]
    if not any(a in SUPPORTED_ARCHITECTURES for a in archs) and raw.get("model_type") != "llama":
        raise ModelLoadError(
            f"{directory}: unsupported architecture {archs!r} (supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    try:
        hidden = int(raw["hidden_size"])
        n_heads = int(raw["num_attention_heads"])
        eos = raw.get("eos_token_id")
        eos_ids = tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None)
        bos = raw.get("bos_token_id")
        return ModelConfig(
            n_layers=int(raw["num_hidden_layers"]),
            hidden=hidden,
            n_heads=n_heads,
            n_kv_heads=int(raw.get("num_key_value_heads") or n_heads),
            head_dim=int(raw.get("head_dim") or hidden // n_heads),
            ffn=int(raw["intermediate_size"]),
            vocab=int(raw["vocab_size"]),
            rope_theta=float(raw.get("rope_theta", 10000.0)),
            rms_eps=float(raw.get("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
            max_positions=int(raw.get("max_position_embeddings", 2048)),
            bos_id=None if bos is None else int(bos),
            eos_ids=eos_ids,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(f"{directory / 'config.json'}: bad or missing field {exc}") from exc


def read_tensors(directory: Path) -> dict[str, torch.Tensor]:
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{directory}: no *.safetensors files")
    out: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            out |= load_file(str(file))
        except (SafetensorError, OSError, ValueError) as exc:
            raise ModelLoadError(f"{file}: corrupt or truncated safetensors ({exc})") from exc
    return out


def read_tokenizer(directory: Path, config: ModelConfig) -> Tokenizer:
    template: str | None = None
    tok_config = directory / "tokenizer_config.json"
    if tok_config.is_file():
        template = _chat_template(_read_json(tok_config).get("chat_template"))
    return Tokenizer.from_hf_dir(directory, config.bos_id, config.eos_ids, template)


def _chat_template(value: object) -> str | None:
    """tokenizer_config.json holds one template, or a list of named ones ("default" is used)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        for entry in value:
            if isinstance(entry, dict) and entry.get("name") == "default":
                template = entry.get("template")
                return template if isinstance(template, str) else None
    return None
