"""The model fixtures of the backend tests, shared here: one SmolLM2 per session."""

from tests.backend.conftest import smollm2, tiny_model, tiny_tokenizer

__all__ = ["smollm2", "tiny_model", "tiny_tokenizer"]
