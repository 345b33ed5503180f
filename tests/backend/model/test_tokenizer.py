"""Tokenizer behaviour: round trips, special tokens, chat templates, streaming detokenization."""

from __future__ import annotations

import pytest

from backend.model import LoadedModel
from backend.model.chat_template import ChatTemplate, ChatTemplateError
from backend.model.tokenizer import Tokenizer

MIXED_TEXT = "Paris é café 😀 naïve 東京 ok"


def stream(tok: Tokenizer, ids: list[int]) -> list[str]:
    dec = tok.incremental()
    deltas = [dec.push(i) for i in ids]
    deltas.append(dec.flush())
    return deltas


def test_byte_level_round_trip(tiny_tokenizer: Tokenizer) -> None:
    ids = tiny_tokenizer.encode(MIXED_TEXT)
    assert len(ids) == len(MIXED_TEXT.encode())
    assert tiny_tokenizer.decode(ids) == MIXED_TEXT


def test_streaming_never_splits_a_character(tiny_tokenizer: Tokenizer) -> None:
    ids = tiny_tokenizer.encode(MIXED_TEXT)
    deltas = stream(tiny_tokenizer, ids)
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == MIXED_TEXT
    # The emoji is four byte tokens: the first three emit nothing.
    emoji_start = len("Paris é café ".encode())
    assert deltas[emoji_start : emoji_start + 3] == ["", "", ""]
    assert deltas[emoji_start + 3] == "😀"


def test_streaming_flush_reports_an_unfinished_character(tiny_tokenizer: Tokenizer) -> None:
    ids = tiny_tokenizer.encode("a😀")[:3]  # "a" and half of the emoji
    deltas = stream(tiny_tokenizer, ids)
    assert deltas[0] == "a"
    assert deltas[-1] == "\ufffd"


def test_special_tokens_are_single_ids_and_skipped_on_decode(tiny_tokenizer: Tokenizer) -> None:
    ids = tiny_tokenizer.encode("<|im_start|>hi<|im_end|>")
    assert ids == [257, *b"hi", 256]
    assert tiny_tokenizer.decode(ids) == "hi"
    assert tiny_tokenizer.decode(ids, skip_special_tokens=False) == "<|im_start|>hi<|im_end|>"


def test_special_token_text_can_be_encoded_as_plain_text(tiny_tokenizer: Tokenizer) -> None:
    ids = tiny_tokenizer.encode("a<|im_end|>", parse_special=False)
    assert ids == list(b"a<|im_end|>")
    assert tiny_tokenizer.encode("a<|im_end|>") == [*b"a", 256]


def test_token_bytes_are_the_bytes_each_token_stands_for(tiny_tokenizer: Tokenizer) -> None:
    text = "naïve — ok\n\t"
    ids = tiny_tokenizer.encode(text)
    assert [tiny_tokenizer.token_bytes(i) for i in ids] == [bytes([b]) for b in text.encode()]
    assert tiny_tokenizer.token_bytes(256) == b"<|im_end|>"  # a special token: its text
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tiny_tokenizer.token_bytes(10_000)


def test_chat_template_renders_messages_and_generation_prompt() -> None:
    template = ChatTemplate(
        "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{{ eos_token }}{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}",
        bos_token="<s>",
        eos_token="</s>",
    )
    messages = [{"role": "user", "content": "hi"}]
    assert template.render(messages) == "[user]hi</s>[assistant]"
    assert template.render(messages, add_generation_prompt=False) == "[user]hi</s>"


def test_chat_template_errors_are_chat_template_errors() -> None:
    template = ChatTemplate("{{ raise_exception('roles must alternate') }}", "", "")
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        template.render([{"role": "user", "content": "x"}])
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{% for %}", "", "")


def test_chat_template_cannot_reach_python_internals() -> None:
    template = ChatTemplate("{{ messages.__class__.__mro__ }}", "", "")
    with pytest.raises(ChatTemplateError):
        template.render([{"role": "user", "content": "x"}])


@pytest.mark.slow
def test_smollm2_chat_prompt(smollm2: LoadedModel) -> None:
    tok = smollm2.tokenizer
    text = tok.render_chat([{"role": "user", "content": "What is the capital of France?"}])
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith(
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tok.encode(text)
    assert ids[0] == 1  # <|im_start|> is one token
    assert tok.eos_ids == (2,)
    assert tok.decode(ids, skip_special_tokens=False) == text


@pytest.mark.slow
def test_smollm2_round_trip_and_digits(smollm2: LoadedModel) -> None:
    tok = smollm2.tokenizer
    ids = tok.encode(MIXED_TEXT + " 12345")
    assert tok.decode(ids) == MIXED_TEXT + " 12345"
    assert len(tok.encode("12345")) == 5  # SmolLM2 splits numbers into single digits
    assert "".join(stream(tok, ids)) == MIXED_TEXT + " 12345"
    assert b"".join(map(tok.token_bytes, ids)) == (MIXED_TEXT + " 12345").encode()
