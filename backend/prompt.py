"""Chat messages to prompt token ids, so that message text can never forge a role boundary.

Invariant: special tokens (such as <|im_start|>) come only from the chat template; the same
strings inside a message's content are encoded as plain text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from backend.errors import BadChat, ContextLengthExceeded
from backend.model.chat_template import ChatTemplateError
from backend.model.tokenizer import Tokenizer
from backend.openai_api import GenerationRequest


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


def prompt_ids(
    tokenizer: Tokenizer, specials: tuple[str, ...], req: GenerationRequest, max_positions: int
) -> list[int]:
    """The request's prompt as token ids; BadChat or ContextLengthExceeded when it cannot run."""
    if req.endpoint == "completion":
        ids = list(tokenizer.encode(req.prompt))  # a raw prompt is the caller's own, specials too
    else:
        try:
            ids = chat_prompt_ids(tokenizer, req.messages, specials)
        except (ChatTemplateError, UnsafeTemplate) as exc:
            raise BadChat(f"cannot render the chat: {exc}", "messages") from None
    if len(ids) + req.sampling.max_tokens > max_positions:
        raise ContextLengthExceeded(
            f"prompt ({len(ids)} tokens) plus max_tokens exceeds the context of {max_positions}",
            "max_tokens",
        )
    return ids
