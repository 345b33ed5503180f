"""The shape of a Llama-architecture decoder, read from GGUF metadata or a config.json.

Invariant: a ModelConfig is immutable and self-consistent (heads divide evenly into KV heads).
"""

from __future__ import annotations

from dataclasses import dataclass

from backend.model.errors import ModelLoadError


@dataclass(frozen=True, slots=True)
class ModelConfig:
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    rope_theta: float
    rms_eps: float
    tie_embeddings: bool
    max_positions: int
    bos_id: int | None
    eos_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.n_heads % self.n_kv_heads != 0:
            raise ModelLoadError(
                f"{self.n_heads} attention heads do not divide into {self.n_kv_heads} KV heads"
            )
        if self.head_dim % 2 != 0:
            raise ModelLoadError(f"head_dim {self.head_dim} must be even for rotary embeddings")

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.n_heads // self.n_kv_heads

    @property
    def q_size(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.n_kv_heads * self.head_dim
