"""The body allowlist: only the path's OpenAI fields and the extra fields the policy allows a
backend stay, and inside chat messages, content parts and Responses input items only their
known keys; anything else is dropped and counted, or, under `gateway.unknown_fields: reject`,
refused with 400. Used by the allowlist filter and whenever a request moves to another backend.

Invariant: no name in `fields.NEVER` reaches the adapter step, at the top level, in a message,
in a content part or in an input item, whatever the policy allows.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any, Final

from gateway.errors import UnknownField
from gateway.inputs import fields
from gateway.inputs.paths import CHAT, RESPONSES, TOKENIZE
from gateway.metrics import Metrics

MAX_NAME_SHOWN: Final = 64


def _drop(mapping: dict[str, Any], keep: Iterable[str], where: str) -> list[str]:
    keep = frozenset(keep)
    gone = [k for k in mapping if k not in keep]
    for key in gone:
        del mapping[key]
    return [f"{where}.{k}" if where else k for k in gone]


def _parts(content: Any, where: str) -> list[str]:
    """Content parts keep their type's keys; a part of an unknown type is dropped whole."""
    if not isinstance(content, list):
        return []
    dropped: list[str] = []
    kept: list[Any] = []
    for part in content:
        if isinstance(part, dict):
            kind = part.get("type")
            keys = fields.PARTS.get(kind) if isinstance(kind, str) else None
            if keys is None:
                dropped.append(where)
                continue
            dropped += _drop(part, keys, where)
            for name, allowed in fields.PAYLOAD.items():
                if isinstance(part.get(name), dict):
                    dropped += _drop(part[name], allowed, f"{where}.{name}")
        kept.append(part)
    content[:] = kept
    return dropped


def _messages(messages: Any) -> list[str]:
    dropped: list[str] = []
    for message in messages if isinstance(messages, list) else ():
        if isinstance(message, dict):
            dropped += _drop(message, fields.MESSAGE, "messages")
            dropped += _parts(message.get("content"), "messages.content")
    return dropped


def _input_items(items: Any) -> list[str]:
    """Responses `input`: items pointing at stored state are dropped; the others lose any
    NEVER key and their content parts are allowlisted like chat's."""
    if not isinstance(items, list):
        return []
    dropped: list[str] = []
    kept: list[Any] = []
    for item in items:
        if isinstance(item, dict):
            if item.get("type") in fields.STORED_ITEMS:
                dropped.append("input")
                continue
            dropped += _drop(item, [k for k in item if k not in fields.NEVER], "input")
            dropped += _parts(item.get("content"), "input.content")
        kept.append(item)
    items[:] = kept
    return dropped


@functools.lru_cache(maxsize=256)  # per path and backend: a handful in any policy
def _allowed(path: str, extras: frozenset[str]) -> tuple[frozenset[str], dict[str, frozenset[str]]]:
    """The top-level names a body may keep, and the inner names kept under a top-level object.
    Callers never mutate what this returns (it is shared)."""
    allowed = (fields.OPENAI[path] | {e for e in extras if "." not in e}) - fields.NEVER
    nested: dict[str, set[str]] = {}
    for extra in extras - fields.NEVER:
        if "." in extra:
            top, inner = extra.split(".", 1)
            nested.setdefault(top, set()).add(inner)
    return allowed, {top: frozenset(inner) for top, inner in nested.items()}


def prune(path: str, body: dict[str, Any], extras: frozenset[str]) -> list[str]:
    """Remove every field `body` may not carry to a backend allowed `extras`; return their
    dotted paths (without list indices), in body order."""
    allowed, nested = _allowed(path, extras)
    dropped: list[str] = []
    for key in list(body):
        if key in nested and isinstance(body[key], dict):
            dropped += _drop(body[key], nested[key], key)
        elif key not in allowed:
            del body[key]
            dropped.append(key)
    if path in (CHAT, TOKENIZE):
        dropped += _messages(body.get("messages"))
    elif path == RESPONSES:
        dropped += _input_items(body.get("input"))
    return dropped


def label(name: str) -> str:
    """A bounded metric label: the dropped field's name when it is a known one."""
    return name if name in fields.KNOWN else "other"


def enforce(
    path: str,
    body: dict[str, Any],
    backend: str,
    extras: frozenset[str],
    reject: bool,
    metrics: Metrics,
) -> None:
    """Prune `body` for `backend`, allowed `extras`; count every dropped field, and with
    `reject` refuse the request (UnknownField) instead of forwarding it without them."""
    dropped = prune(path, body, extras)
    if dropped:
        account(dropped, backend, reject, metrics)


def account(dropped: list[str], backend: str, reject: bool, metrics: Metrics) -> None:
    """Count the fields `prune` dropped; with `reject`, refuse the request (UnknownField)."""
    action = "reject" if reject else "drop"
    for name in dropped:
        metrics.child(metrics.unknown_fields, backend, label(name), action).inc()
    if reject:
        raise UnknownField(
            f"body field {dropped[0][:MAX_NAME_SHOWN]!r} is not accepted for this model"
        )
