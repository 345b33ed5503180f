"""Chat messages to prompt token ids, so that message text can never forge a role boundary.

Invariant: special tokens (such as <|im_start|>) come only from the chat template; the same
strings inside a message's content are encoded as plain text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from backend.model.tokenizer import Tokenizer


class UnsafeTemplate(ValueError):
    """The template does not carry message content verbatim, so it cannot be encoded safely."""


def special_strings(tokenizer: Tokenizer) -> tuple[str, ...]:
    added = tokenizer.inner.get_added_tokens_decoder().values()
    return tuple(t.content for t in added if t.special)


def chat_prompt_ids(
    tokenizer: Tokenizer, messages: Sequence[Mapping[str, str]], specials: tuple[str, ...]
) -> list[int]:
    if not any(s in m["content"] for m in messages for s in specials):
        return tokenizer.encode(tokenizer.render_chat(messages, add_generation_prompt=True))
    # Render with markers in place of the contents, then encode template and message text apart.
    marks = [f"\ue000{i}\ue001" for i in range(len(messages))]
    placed = [{**m, "content": mark} for m, mark in zip(messages, marks, strict=True)]
    rest = tokenizer.render_chat(placed, add_generation_prompt=True)
    ids: list[int] = []
    for message, mark in zip(messages, marks, strict=True):
        head, found, rest = rest.partition(mark)
        if not found:
            raise UnsafeTemplate("the chat template does not carry message content verbatim")
        ids += tokenizer.encode(head)
        ids += tokenizer.encode(message["content"], parse_special=False)
    return ids + tokenizer.encode(rest)
