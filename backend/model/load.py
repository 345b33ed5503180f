"""The one entry point that turns a model spec into a ready model, config and tokenizer.

Invariant: device "auto" is CUDA when available, else CPU; dtype "auto" (the default) is
decided by backend.model.precision from what the hardware really has, and the loaded model
carries the reason; every failure is a ModelLoadError.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from backend.model import gguf_loader, hf_loader
from backend.model.config import ModelConfig
from backend.model.errors import ModelLoadError
from backend.model.llama import Llama
from backend.model.precision import DtypeChoice, choose_dtype, detect_hardware
from backend.model.resolve import resolve_model
from backend.model.tokenizer import Tokenizer
from backend.model.weights import build_llama


@dataclass(frozen=True, slots=True)
class LoadedModel:
    model: Llama
    config: ModelConfig
    tokenizer: Tokenizer
    device: torch.device
    dtype: torch.dtype
    name: str
    dtype_reason: str = ""


def pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        chosen = torch.device(device)
    except RuntimeError as exc:
        raise ModelLoadError(f"unknown device {device!r}") from exc
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r} requested but CUDA is not available")
    return chosen


def pick_dtype(dtype: str | None, device: torch.device) -> DtypeChoice:
    """dtype: None or "auto" (decided by the hardware), or an explicit dtype name."""
    try:
        return choose_dtype(dtype, detect_hardware(device))
    except ValueError as exc:
        raise ModelLoadError(str(exc)) from exc


def load_model(spec: str, device: str = "auto", dtype: str | None = None) -> LoadedModel:
    """spec: "smollm2", a .gguf file, or a Hugging Face directory."""
    source = resolve_model(spec)
    dev = pick_device(device)
    choice = pick_dtype(dtype, dev)
    if source.format == "gguf":
        g = gguf_loader.GGUFFile(source.path)
        config = gguf_loader.read_config(g)
        tokenizer = gguf_loader.read_tokenizer(g, config)
        tensors = gguf_loader.read_tensors(g, config)
    else:
        config = hf_loader.read_config(source.path)
        tokenizer = hf_loader.read_tokenizer(source.path, config)
        tensors = hf_loader.read_tensors(source.path)
    with torch.inference_mode():
        model = build_llama(config, tensors, dev, choice.dtype)
    return LoadedModel(model, config, tokenizer, dev, choice.dtype, source.name, choice.reason)
