"""Typed reading of a composed YAML tree, so every policy error names file, line and key path.

Invariant: a read either returns a value of the asked type or records one error and raises
`Bail`, which the loader catches per item so one run reports every independent error.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import yaml

T = TypeVar("T")
_STR = "tag:yaml.org,2002:str"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_BOOL = "tag:yaml.org,2002:bool"


class PolicyError(Exception):
    """A policy was refused; `errors` holds one `file:line: path: message` line per problem."""

    def __init__(self, errors: list[str]) -> None:
        errors = sorted(errors, key=_line_of)
        super().__init__("\n".join(errors))
        self.errors = errors
        self.sources: frozenset[Path] = frozenset()  # what the refused load read (load_policy)


def _line_of(error: str) -> int:
    """The line number in `file:line: path: message` (file names may hold colons)."""
    for part in error.split(": ", 1)[0].rsplit(":", 1)[1:]:
        if part.isdigit():
            return int(part)
    return 0


class Bail(Exception):
    """An error was recorded for this item; stop reading it."""


@dataclass(slots=True)
class Errors:
    source: str
    lines: list[str] = field(default_factory=list)

    def record(self, node: yaml.Node, path: str, message: str) -> Bail:
        self.lines.append(f"{self.source}:{node.start_mark.line + 1}: {path}: {message}")
        return Bail()


@dataclass(frozen=True, slots=True)
class Node:
    node: yaml.Node
    path: str
    errors: Errors

    def fail(self, message: str) -> NoReturn:
        raise self.errors.record(self.node, self.path or "(top level)", message)

    def child(self, key: str, node: yaml.Node) -> Node:
        return Node(node, f"{self.path}.{key}" if self.path else key, self.errors)

    def mapping(self, required: frozenset[str], optional: frozenset[str]) -> dict[str, Node]:
        if not isinstance(self.node, yaml.MappingNode):
            self.fail("must be a mapping")
        out: dict[str, Node] = {}
        for key_node, value_node in self.node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            if not isinstance(key, str):
                raise self.errors.record(key_node, self.path or "(top level)", "keys must be text")
            where = self.child(key, key_node)
            if key in out:
                self.errors.record(key_node, where.path, "duplicate key")
            elif key not in required | optional:
                allowed = ", ".join(sorted(required | optional))
                self.errors.record(key_node, where.path, f"unknown key (allowed: {allowed})")
            else:
                out[key] = self.child(key, value_node)
        missing = sorted(required - out.keys())
        if missing:
            self.fail(f"missing required key {missing[0]}")
        return out

    def items(self) -> list[Node]:
        if not isinstance(self.node, yaml.SequenceNode):
            self.fail("must be a list")
        return [Node(n, f"{self.path}[{i}]", self.errors) for i, n in enumerate(self.node.value)]

    def _scalar(self, tags: tuple[str, ...], what: str) -> str:
        if not isinstance(self.node, yaml.ScalarNode) or self.node.tag not in tags:
            self.fail(f"must be {what}")
        return str(self.node.value)

    def text(self, pattern: re.Pattern[str] | None = None, hint: str = "") -> str:
        value = self._scalar((_STR,), "a string")
        if not value or (pattern is not None and not pattern.fullmatch(value)):
            self.fail(f"must be a non-empty string{' ' + hint if hint else ''}")
        return value

    def choice(self, options: tuple[str, ...]) -> str:
        value = self._scalar((_STR,), "a string")
        if value not in options:
            self.fail(f"must be one of {', '.join(options)}")
        return value

    def boolean(self) -> bool:
        return self._scalar((_BOOL,), "true or false").lower() in {"true", "yes", "on"}

    def integer(self, low: int, high: int) -> int:
        value = int(self._scalar((_INT,), "an integer"), 0)
        if not low <= value <= high:
            self.fail(f"must be between {low} and {high}")
        return value

    def number(self, low: float, high: float) -> float:
        value = float(self._scalar((_INT, _FLOAT), "a number"))
        if not low <= value <= high:
            self.fail(f"must be between {low:g} and {high:g}")
        return value

    def positive(self) -> float:
        value = float(self._scalar((_INT, _FLOAT), "a number"))
        if not 0 < value < 86400:
            self.fail("must be a number of seconds above 0")
        return value

    def exactly(self, expected: int) -> int:
        value = int(self._scalar((_INT,), "an integer"), 0)
        if value != expected:
            self.fail(f"must be {expected}")
        return value

    def version_text(self) -> str:
        return self._scalar((_STR, _INT), "a string")


def compose(text: str, source: str) -> Node:
    errors = Errors(source)
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise PolicyError([yaml_error(exc, source)]) from None
    except RecursionError:  # the composer recurses once per nesting level
        raise PolicyError([f"{source}:1: (top level): nested too deeply"]) from None
    if root is None:
        raise PolicyError([f"{source}:1: (top level): the policy is empty"])
    return Node(root, "", errors)


def yaml_error(exc: yaml.YAMLError, source: str) -> str:
    """The parser's reason in one line, `file:line:column:` first (editors jump there), with
    where the construct it was reading started."""
    mark = getattr(exc, "problem_mark", None)
    where = f"{mark.line + 1}:{mark.column + 1}" if mark is not None else "1:1"
    problem = getattr(exc, "problem", None) or "not parseable"
    text = f"{source}:{where}: not valid YAML: {problem}"
    if "'\\t'" in problem:
        text += " (YAML indents with spaces, never tabs)"
    context, start = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and start is not None:
        text += f" ({context} that starts at line {start.line + 1}, column {start.column + 1})"
    elif context:
        text += f" ({context})"
    return text


def optional(f: Mapping[str, Node], **read: Callable[[Node], Any]) -> dict[str, Any]:
    """The optional keys present in `f`, each read by its reader, by field name, in the readers'
    order. A key left out is left out here too, so the dataclass's own default applies: every
    default is stated once, on its dataclass (`Cls(required..., **optional(f, ...))`)."""
    return {name: reader(f[name]) for name, reader in read.items() if name in f}


def guarded(read: Callable[[], T]) -> T | None:
    """Run one item's reader; an error was already recorded when this returns None."""
    try:
        return read()
    except Bail:
        return None


def unique_items(
    node: Node, read: Callable[[Node], T], name_of: Callable[[T], str], what: str
) -> tuple[T, ...]:
    """Each list item read on its own (one bad item does not hide the others' errors); a
    repeated name is an error at the repeating item."""
    out: list[T] = []

    def one(item: Node) -> T:
        value = read(item)
        if any(name_of(v) == name_of(value) for v in out):
            item.fail(f"duplicate {what} {name_of(value)}")
        return value

    for item in guarded(node.items) or []:
        value = guarded(partial(one, item))
        if value is not None:
            out.append(value)
    return tuple(out)
