"""The same model in Hugging Face transformers on the same device, beside our engine: batched
greedy `generate` over the same prompt token ids, left-padded, at each stream count.

Invariant: the weights come from the same file our loader read (a .gguf through transformers'
GGUF loader, or the same Hugging Face directory), cast to our dtype; every stream generates
exactly `max_tokens` (end-of-sequence suppressed), as ours does; times follow a device sync.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from backend.model import LoadedModel
from backend.model.resolve import resolve_model


def load_hf(spec: str, loaded: LoadedModel) -> Any:
    """transformers' model for `spec` (smollm2, a .gguf file or an HF directory) on our device
    and dtype."""
    from transformers import AutoModelForCausalLM

    source = resolve_model(spec)
    model: Any
    if source.format == "gguf":
        model = AutoModelForCausalLM.from_pretrained(source.path.parent, gguf_file=source.path.name)
    else:
        model = AutoModelForCausalLM.from_pretrained(Path(source.path))
    return model.to(device=loaded.device, dtype=loaded.dtype).eval()


def padded(
    prompts: list[list[int]], pad: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ids and attention mask: ids, mask [B, L]."""
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    return ids.to(device), mask.to(device)


def generate(
    model: Any, prompts: list[list[int]], max_tokens: int, pad: int
) -> tuple[torch.Tensor, float]:
    """Generated ids [B, max_tokens] and the seconds it took, prefill included."""
    ids, mask = padded(prompts, pad, model.device)
    _sync(model.device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            do_sample=False,
            pad_token_id=pad,
        )
    _sync(model.device)
    return out[:, ids.shape[1] :], time.perf_counter() - start


def row(model: Any, prompts: list[list[int]], max_tokens: int, pad: int) -> dict[str, Any]:
    made, seconds = generate(model, prompts, max_tokens, pad)
    return {
        "streams": len(prompts),
        "tokens_per_s": round(made.numel() / seconds, 1),
        "tokens": made.numel(),
        "seconds": round(seconds, 3),
        "first_stream_ids": made[0].tolist(),
    }


def agreeing_prefix(ours: list[int], theirs: list[int]) -> int:
    """How many leading greedy tokens both engines chose alike (numerics may part them later)."""
    n = 0
    for a, b in zip(ours, theirs, strict=False):
        if a != b:
            break
        n += 1
    return n


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
