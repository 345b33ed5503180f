"""The torch side: the Llama decoder, its loaders and the tokenizer."""

from backend.model.errors import ModelLoadError
from backend.model.load import LoadedModel, load_model

__all__ = ["LoadedModel", "ModelLoadError", "load_model"]
