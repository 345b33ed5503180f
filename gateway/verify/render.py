"""What a server turns into the prompt, as the detective fingerprints it: chat messages with
their text content parts joined by a newline (as vLLM joins them for string-content templates),
a Responses request's instructions and input as the same messages, and a completions prompt as
text or as token ids. Pure.

Invariant: two requests that a server renders to the same prompt give the same messages (or the
same completions prompt) here, whichever of the equivalent forms each one used.
"""

from __future__ import annotations

from typing import Any, Final

import orjson

from gateway.inputs import jsonbody
from gateway.inputs.paths import CHAT, RESPONSES

PART_JOIN: Final = "\n"
_TEXT_PARTS: Final = frozenset({"text", "input_text", "output_text"})
_PROMPT_FIELDS: Final = ("tools", "functions", "response_format")  # rendered by many templates


def content_text(content: Any) -> str:
    """A message's content as the prompt carries it: a string as it is; content parts' texts
    joined by a newline; a part that is not text (an image, audio) by its exact JSON, so it
    matches only itself."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    parts = content if isinstance(content, list) else [content]
    return PART_JOIN.join(_part_text(part) for part in parts)


def _part_text(part: Any) -> str:
    if isinstance(part, str):
        return part
    if isinstance(part, dict) and part.get("type", "text") in _TEXT_PARTS:
        text = part.get("text")
        if isinstance(text, str):
            return text
    return jsonbody.dumps(part, orjson.OPT_SORT_KEYS).decode()


def all_text(content: Any) -> bool:
    """Whether every part of `content` is text (so a chat template can render it exactly)."""
    if isinstance(content, str) or content is None:
        return True
    parts = content if isinstance(content, list) else [content]
    return all(
        isinstance(p, str)
        or (isinstance(p, dict) and p.get("type", "text") in _TEXT_PARTS and "text" in p)
        for p in parts
    )


def messages(path: str, body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The conversation a chat or Responses request renders, content as text; None for a
    completions request or a body that has none."""
    if path == CHAT:
        found = body.get("messages")
        if not isinstance(found, list):
            return None
        return [_message(m) for m in found if isinstance(m, dict)]
    if path != RESPONSES:
        return None
    out = []
    if isinstance(body.get("instructions"), str):
        out.append({"role": "system", "content": body["instructions"]})
    items = body.get("input")
    if isinstance(items, str):
        return [*out, {"role": "user", "content": items}]
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict):
            out.append(_message(item))
    return out


def _message(m: dict[str, Any]) -> dict[str, Any]:
    role = m.get("role", m.get("type"))
    rendered = {"role": str(role), "content": content_text(m.get("content"))}
    for key in ("name", "tool_calls", "tool_call_id"):
        if m.get(key) is not None:
            rendered[key] = m[key]
    return rendered


def plain_messages(path: str, body: dict[str, Any]) -> bool:
    """A conversation whose every message is text only, with no tools: a chat template renders
    it the same here and at the server."""
    if any(body.get(k) is not None for k in _PROMPT_FIELDS):
        return False
    raw = body.get("messages") if path == CHAT else body.get("input")
    if isinstance(raw, str):
        return True
    return isinstance(raw, list) and all(
        isinstance(m, dict) and all_text(m.get("content")) and m.get("tool_calls") is None
        for m in raw
    )


def completion_prompt(body: dict[str, Any]) -> str | list[int] | None:
    """A completions request's one prompt: text, or token ids; None for a batch of prompts or
    anything else (those are fingerprinted by the bound only)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]  # a batch of one is that prompt
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(_token(t) for t in prompt):
        return list(prompt)
    return None


def _token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 32


def prompt_fields(body: dict[str, Any]) -> list[tuple[str, str]]:
    """Fields many chat templates render into the prompt, as canonical JSON."""
    return [
        (key, jsonbody.dumps(body[key], orjson.OPT_SORT_KEYS).decode())
        for key in _PROMPT_FIELDS
        if body.get(key) is not None
    ]
