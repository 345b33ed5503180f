"""Which request fields the backend takes: those it implements, and OpenAI's fields it does not
implement, each with the values that leave its feature off.

Invariant: a field the backend would otherwise ignore is refused (400 naming it), unless its
value is null or one that asks for nothing, so no answer silently differs from what was asked.
"""

from __future__ import annotations

from typing import Any, Final

from backend.errors import BadRequest

_COMMON: Final = frozenset(
    {"model", "stream", "stream_options", "n", "max_tokens", "max_completion_tokens", "seed",
     "temperature", "top_p", "stop", "ignore_eos"}
)  # fmt: skip
IMPLEMENTED: Final[dict[str, frozenset[str]]] = {
    "chat": _COMMON | {"messages", "logprobs", "top_logprobs"},
    "completion": _COMMON | {"prompt", "logprobs"},
}
# Fields without effect on the answer: OpenAI uses them to identify the end user.
IGNORED: Final = frozenset({"user", "safety_identifier"})

# Not implemented: the values (besides null) that ask for nothing and so are accepted.
_OFF: Final[dict[str, tuple[Any, ...]]] = {
    "frequency_penalty": (0, 0.0),
    "presence_penalty": (0, 0.0),
    "logit_bias": ({},),
    "response_format": ({"type": "text"},),
    "tools": (),
    "tool_choice": ("none",),
    "parallel_tool_calls": (),
    "functions": (),
    "function_call": ("none",),
    "store": (False,),
    "metadata": (),
    "modalities": (["text"],),
    "audio": (),
    "prediction": (),
    "reasoning_effort": (),
    "verbosity": (),
    "web_search_options": (),
    "service_tier": ("auto", "default"),
    # /v1/completions
    "echo": (False,),
    "suffix": (),
    "best_of": (1,),
}
_WHY: Final[dict[str, str]] = {
    "response_format": 'structured output is not implemented (only {"type": "text"})',
    "tools": "tool calling is not implemented",
    "tool_choice": 'tool calling is not implemented (only "none")',
    "parallel_tool_calls": "tool calling is not implemented",
    "functions": "function calling is not implemented",
    "function_call": 'function calling is not implemented (only "none")',
}


def check_fields(body: dict[str, Any], endpoint: str) -> None:
    """BadRequest naming the first field this endpoint does not implement and that asks for
    something; fields it implements are validated by the caller."""
    implemented = IMPLEMENTED[endpoint]
    for name, value in body.items():
        if name in implemented or name in IGNORED or value is None:
            continue
        if name not in _OFF:
            raise BadRequest(f"unrecognized request field {name[:64]!r}", name[:64])
        if not any(_same(value, off) for off in _OFF[name]):
            why = _WHY.get(name, f"'{name}' is not implemented by this backend")
            raise BadRequest(f"{why}; leave '{name}' out", name)


def _same(value: Any, off: Any) -> bool:
    """Equal with booleans and numbers kept apart (False is not 0)."""
    if isinstance(value, bool) != isinstance(off, bool):
        return False
    return bool(value == off)
