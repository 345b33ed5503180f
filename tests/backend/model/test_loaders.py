"""Loading models: the GGUF and Hugging Face paths, device and dtype choice, and clear errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from backend.model import LoadedModel, ModelLoadError, load_model
from backend.model.gguf_loader import unpermute_rotary
from backend.model.load import pick_device, pick_dtype
from backend.model.resolve import resolve_model
from backend.model.weights import to_hf_tensors


def smollm2_file() -> Path:
    return resolve_model("smollm2").path


def llama_cpp_permute(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The row order llama.cpp's converter writes Q/K in (the transformation to undo)."""
    rows, cols = weight.shape
    return (
        weight.reshape(n_heads, 2, rows // n_heads // 2, cols).transpose(1, 2).reshape(rows, cols)
    )


def test_unpermute_inverts_the_gguf_rotary_layout() -> None:
    w = torch.arange(6 * 8 * 5, dtype=torch.float32).reshape(6 * 8, 5)
    assert torch.equal(unpermute_rotary(llama_cpp_permute(w, 6), 6), w)
    assert not torch.equal(llama_cpp_permute(w, 6), w)


def test_nonexistent_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="no such model file or directory"):
        load_model(str(tmp_path / "missing.gguf"))


def test_file_that_is_not_gguf(tmp_path: Path) -> None:
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"PK\x03\x04 this is a zip")
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        load_model(str(fake))


@pytest.mark.parametrize("size", [64, 4096, 1_000_000, 50_000_000])
def test_truncated_gguf_is_a_clear_error(tmp_path: Path, size: int) -> None:
    cut = tmp_path / "cut.gguf"
    with smollm2_file().open("rb") as src, cut.open("wb") as dst:
        dst.write(src.read(size))
    with pytest.raises(ModelLoadError, match="corrupt or truncated"):
        load_model(str(cut), device="cpu")


def test_gguf_with_unsupported_architecture(tmp_path: Path) -> None:
    path = tmp_path / "other.gguf"
    writer = gguf.GGUFWriter(str(path), "mamba")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelLoadError, match="unsupported architecture 'mamba'"):
        load_model(str(path), device="cpu")


def test_hf_config_with_unsupported_architecture(tmp_path: Path) -> None:
    config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="unsupported architecture"):
        load_model(str(tmp_path), device="cpu")


def test_hf_directory_without_config(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"config\.json: missing"):
        load_model(str(tmp_path), device="cpu")


def test_auto_device_follows_cuda_availability(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device("auto") == torch.device("cpu")
    with pytest.raises(ModelLoadError, match="CUDA is not available"):
        pick_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pick_device("auto") == torch.device("cuda")


def test_dtype_choice() -> None:
    assert pick_dtype("float32", torch.device("cpu")).dtype == torch.float32
    assert pick_dtype("bfloat16", torch.device("cpu")).dtype == torch.bfloat16
    auto = pick_dtype(None, torch.device("cpu"))
    assert auto.dtype in (torch.float32, torch.bfloat16)
    assert auto.reason.startswith("auto: ")
    assert pick_dtype("auto", torch.device("cpu")) == auto
    with pytest.raises(ModelLoadError, match="unknown dtype"):
        pick_dtype("int3", torch.device("cpu"))


def test_smollm2_resolves_to_the_packaged_gguf() -> None:
    source = resolve_model("smollm2")
    assert source.format == "gguf"
    assert source.path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert source.path.stat().st_size > 90_000_000


@pytest.mark.slow
def test_smollm2_config_from_gguf_metadata(smollm2: LoadedModel) -> None:
    c = smollm2.config
    assert (c.n_layers, c.hidden, c.n_heads, c.n_kv_heads, c.head_dim) == (30, 576, 9, 3, 64)
    assert (c.ffn, c.vocab, c.rope_theta, c.max_positions) == (1536, 49152, 100000.0, 8192)
    assert c.tie_embeddings
    assert (c.bos_id, c.eos_ids) == (1, (2,))


def write_hf_dir(loaded: LoadedModel, directory: Path) -> None:
    c = loaded.config
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": c.hidden,
        "intermediate_size": c.ffn,
        "num_attention_heads": c.n_heads,
        "num_hidden_layers": c.n_layers,
        "num_key_value_heads": c.n_kv_heads,
        "rms_norm_eps": c.rms_eps,
        "rope_theta": c.rope_theta,
        "vocab_size": c.vocab,
        "tie_word_embeddings": c.tie_embeddings,
        "max_position_embeddings": c.max_positions,
        "bos_token_id": c.bos_id,
        "eos_token_id": list(c.eos_ids),
    }
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    save_file(to_hf_tensors(loaded.model), str(directory / "model.safetensors"))
    (directory / "tokenizer.json").write_text(loaded.tokenizer.to_json())
    template = {"chat_template": loaded.tokenizer.chat_template.source}
    (directory / "tokenizer_config.json").write_text(json.dumps(template))


@pytest.mark.slow
def test_hf_directory_loads_the_same_model(smollm2: LoadedModel, tmp_path: Path) -> None:
    directory = tmp_path / "smollm2-hf"
    write_hf_dir(smollm2, directory)
    hf = load_model(str(directory), device=str(smollm2.device))
    assert hf.config == smollm2.config
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    text = hf.tokenizer.render_chat(messages)
    assert text == smollm2.tokenizer.render_chat(messages)
    ids = hf.tokenizer.encode(text)
    assert ids == smollm2.tokenizer.encode(text)
    with torch.inference_mode():
        expected = smollm2.model.forward_dense(ids)
        got = hf.model.forward_dense(ids)
    assert torch.equal(got, expected)


@pytest.mark.slow
def test_truncated_safetensors_is_a_clear_error(smollm2: LoadedModel, tmp_path: Path) -> None:
    directory = tmp_path / "cut-hf"
    write_hf_dir(smollm2, directory)
    weights = directory / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="corrupt or truncated safetensors"):
        load_model(str(directory), device="cpu")
    shutil.rmtree(directory)
