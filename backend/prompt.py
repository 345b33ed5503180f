"""Chat messages to prompt token ids, so that message text can never forge a role boundary.

Invariant: special tokens (such as <|im_start|>) come only from the chat template; the same
strings inside a message's content are encoded as plain text. The ids of a public prefix are
rendered from its public messages alone.
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


def _pieces(
    tokenizer: Tokenizer, messages: Sequence[Mapping[str, str]], generation: bool
) -> tuple[list[tuple[str, str]], str]:
    """Render with markers in place of the contents: (template text before each message's
    content, that content) for each message, and the template text after the last one."""
    marks = [f"\ue000{i}\ue001" for i in range(len(messages))]
    placed = [{**m, "content": mark} for m, mark in zip(messages, marks, strict=True)]
    rest = tokenizer.render_chat(placed, add_generation_prompt=generation)
    pieces: list[tuple[str, str]] = []
    for message, mark in zip(messages, marks, strict=True):
        head, found, rest = rest.partition(mark)
        if not found:
            raise UnsafeTemplate("the chat template does not carry message content verbatim")
        pieces.append((head, message["content"]))
    return pieces, rest


def _encode_pieces(tokenizer: Tokenizer, pieces: list[tuple[str, str]]) -> list[int]:
    """Template text with its special tokens, message text as plain text."""
    ids: list[int] = []
    for head, content in pieces:
        ids += tokenizer.encode(head)
        ids += tokenizer.encode(content, parse_special=False)
    return ids


def has_specials(messages: Sequence[Mapping[str, str]], specials: tuple[str, ...]) -> bool:
    return any(s in m["content"] for m in messages for s in specials)


def chat_prompt_ids(
    tokenizer: Tokenizer, messages: Sequence[Mapping[str, str]], specials: tuple[str, ...]
) -> list[int]:
    if not has_specials(messages, specials):
        return tokenizer.encode(tokenizer.render_chat(messages, add_generation_prompt=True))
    # Encode template and message text apart, so message text cannot make a special token.
    pieces, rest = _pieces(tokenizer, messages, generation=True)
    return _encode_pieces(tokenizer, pieces) + tokenizer.encode(rest)


def public_chat_ids(
    tokenizer: Tokenizer, public: Sequence[Mapping[str, str]], piecewise: bool
) -> list[int]:
    """The ids of leading public messages rendered alone (the last one's content already cut
    to its public characters), up to the end of that content: the template sees nothing but
    public text, so every id comes from public text or the template. `piecewise` as the whole
    prompt was encoded (`has_specials` of all its messages), so the two agree where they can."""
    if piecewise:
        return _encode_pieces(tokenizer, _pieces(tokenizer, public, generation=False)[0])
    end = "\ue000end\ue001"
    placed = [*public[:-1], {**public[-1], "content": public[-1]["content"] + end}]
    head, found, _ = tokenizer.render_chat(placed, add_generation_prompt=False).partition(end)
    return tokenizer.encode(head) if found else []


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
