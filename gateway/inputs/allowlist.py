"""The body allowlist: a field stays when it is one of the path's OpenAI fields, one the route's
backend kind forwards by default (gateway.inputs.kinds), or one the policy allows that backend
(`backends[].extra_fields`); inside chat messages, content parts and Responses input items only
their known keys stay. A NEVER name (one that could select or widen a cache scope) is stripped
and counted, or refused under `gateway.client_inputs: reject`; anything else is refused with 400
naming it (the default, `gateway.unknown_fields: reject`) or dropped and counted (`drop`). Used
by the allowlist filter and whenever a request moves to another backend.

Invariant: no name in `fields.NEVER` or `fields.REFUSED` reaches the adapter step, at the top
level, in a message, in a content part or in an input item, whatever the policy allows.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from gateway.errors import ClientInputRejected, UnknownField
from gateway.inputs import fields, kinds
from gateway.inputs.paths import RESPONSES
from gateway.metrics import Metrics

MAX_NAME_SHOWN: Final = 64


@dataclass(slots=True)
class Pruned:
    """What `prune` took out of a body, as dotted paths without list indices, in body order."""

    stripped: list[str] = field(default_factory=list)  # NEVER names
    refused: list[str] = field(default_factory=list)  # unknown, held or refused names

    def add(self, name: str, where: str) -> None:
        shown = f"{where}.{name}" if where else name
        never = name in fields.NEVER or shown in fields.NEVER
        (self.stripped if never else self.refused).append(shown)

    def __bool__(self) -> bool:
        return bool(self.stripped or self.refused)


def _drop(mapping: dict[str, Any], keep: Iterable[str], where: str, out: Pruned) -> None:
    keep = frozenset(keep)
    for key in [k for k in mapping if k not in keep]:
        del mapping[key]
        out.add(key, where)


def _parts(content: Any, where: str, out: Pruned) -> None:
    """Content parts keep their type's keys; a part of an unknown type is taken out whole."""
    if not isinstance(content, list):
        return
    kept: list[Any] = []
    for part in content:
        if isinstance(part, dict):
            kind = part.get("type")
            keys = fields.PARTS.get(kind) if isinstance(kind, str) else None
            if keys is None:
                out.refused.append(f"{where}.{kind}" if isinstance(kind, str) else where)
                continue
            _drop(part, keys, where, out)
            for name, allowed in fields.PAYLOAD.items():
                if isinstance(part.get(name), dict):
                    _drop(part[name], allowed, f"{where}.{name}", out)
        kept.append(part)
    content[:] = kept


def _messages(messages: Any, out: Pruned) -> None:
    for message in messages if isinstance(messages, list) else ():
        if isinstance(message, dict):
            _drop(message, fields.MESSAGE, "messages", out)
            _parts(message.get("content"), "messages.content", out)


def _input_items(items: Any, out: Pruned) -> None:
    """Responses `input`: items pointing at stored state are stripped; the others lose any
    NEVER key and their content parts are allowlisted like chat's."""
    if not isinstance(items, list):
        return
    kept: list[Any] = []
    for item in items:
        if isinstance(item, dict):
            if item.get("type") in fields.STORED_ITEMS:
                out.stripped.append("input")
                continue
            _drop(item, [k for k in item if k not in fields.NEVER], "input", out)
            _parts(item.get("content"), "input.content", out)
        kept.append(item)
    items[:] = kept


@functools.lru_cache(maxsize=256)  # per path, kind and extras: a handful in any policy
def _allowed(
    path: str, kind: str, extras: frozenset[str]
) -> tuple[frozenset[str], dict[str, frozenset[str]]]:
    """The top-level names a body may keep, and the inner names kept under a top-level object.
    Callers never mutate what this returns (it is shared)."""
    names = (kinds.forwarded(kind, path) | extras) - fields.NEVER - set(fields.REFUSED)
    allowed = fields.OPENAI[path] | {n for n in names if "." not in n}
    nested: dict[str, set[str]] = {}
    for name in names:
        if "." in name:
            top, inner = name.split(".", 1)
            nested.setdefault(top, set()).add(inner)
    return allowed, {top: frozenset(inner) for top, inner in nested.items()}


def prune(path: str, body: dict[str, Any], kind: str, extras: frozenset[str]) -> Pruned:
    """Remove every field `body` may not carry on `path` to a `kind` backend allowed `extras`."""
    allowed, nested = _allowed(path, kind, extras)
    out = Pruned()
    for key in list(body):
        if key in nested and isinstance(body[key], dict):
            _drop(body[key], nested[key], key, out)
        elif key not in allowed:
            del body[key]
            out.add(key, "")
    if "messages" in allowed:
        _messages(body.get("messages"), out)
    if path == RESPONSES:
        _input_items(body.get("input"), out)
    return out


def label(name: str) -> str:
    """A bounded metric label: the field's name when it is a known one."""
    return name if name in kinds.KNOWN else "other"


def _why(name: str, kind: str) -> str:
    shown = name[:MAX_NAME_SHOWN]
    top = name.rsplit(".", 1)[-1]
    if top in fields.REFUSED:
        return f"body field {shown!r} is never forwarded: {fields.REFUSED[top]}"
    if name in kinds.held(kind):
        return (
            f"body field {shown!r} reaches past this request; a policy forwards it to a {kind} "
            f"backend by listing it in backends[].extra_fields"
        )
    if kind in kinds.CLOSED:  # its whole vocabulary is known: nothing more can be allowed
        return (
            f"body field {shown!r} is not one {kind} backends take (docs/api.md lists them; "
            "gateway.unknown_fields: drop drops unknown fields instead)"
        )
    return (
        f"body field {shown!r} is not one the gateway knows for {kind} backends; a policy "
        "forwards it by listing it in backends[].extra_fields (or drops unknown fields with "
        "gateway.unknown_fields: drop)"
    )


def account(
    pruned: Pruned, kind: str, backend: str, modes: tuple[bool, bool], metrics: Metrics
) -> None:
    """Count what `prune` took out. `modes` is (reject scoping inputs, reject unknown fields):
    with the first, a stripped NEVER name refuses the request (ClientInputRejected); with the
    second, any other name does (UnknownField, naming it and how a policy allows it)."""
    reject_scoping, reject_unknown = modes
    for name in pruned.stripped:
        action = "reject" if reject_scoping else "strip"
        metrics.child(metrics.unknown_fields, backend, label(name), action).inc()
    for name in pruned.refused:
        action = "reject" if reject_unknown else "drop"
        metrics.child(metrics.unknown_fields, backend, label(name), action).inc()
    if pruned.stripped and reject_scoping:
        name = pruned.stripped[0][:MAX_NAME_SHOWN]
        raise ClientInputRejected(
            f"body field {name!r} is never forwarded: it could select or widen a cache scope",
            param=name,
        )
    if pruned.refused and reject_unknown:
        name = pruned.refused[0]
        raise UnknownField(_why(name, kind), param=name[:MAX_NAME_SHOWN])


def enforce(
    path: str,
    body: dict[str, Any],
    kind: str,
    backend: str,
    extras: frozenset[str],
    modes: tuple[bool, bool],
    metrics: Metrics,
) -> None:
    """Prune `body` for a `kind` backend allowed `extras`, and account for what was taken."""
    pruned = prune(path, body, kind, extras)
    if pruned:
        account(pruned, kind, backend, modes, metrics)
