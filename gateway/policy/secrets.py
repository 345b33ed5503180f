"""Secret references: `{env: NAME}` or `{file: PATH}` (relative to the policy's folder), the
type every part of the policy holds a secret in, and how one is read.

Invariant: a secret is never written inline in a policy; a missing or empty one is an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from gateway.policy.node import Node
from gateway.policy.sources import note
from kvfence.keys.secrets import SecretError, from_env, from_file

_KEYS = frozenset({"env", "file"})


@dataclass(frozen=True, slots=True)
class SecretRef:
    """`{env: NAME}` or `{file: PATH}`; never the secret itself."""

    source: str  # "env" | "file"
    name: str

    def __str__(self) -> str:
        return f"{{{self.source}: {self.name}}}"


@dataclass(frozen=True, slots=True)
class Secret:
    ref: SecretRef
    value: bytes = field(repr=False)


FORMS = (
    "must be {env: NAME} (an environment variable) or {file: PATH} (a file, relative to the "
    "policy's folder); secrets are never written inline"
)


def read_ref(node: Node) -> SecretRef:
    if not isinstance(node.node, yaml.MappingNode):
        node.fail(FORMS)
    fields = node.mapping(frozenset(), _KEYS)
    if len(fields) != 1:
        node.fail(FORMS)
    ((source, value),) = fields.items()
    return SecretRef(source, value.text())


def resolve(node: Node, env: Mapping[str, str], base: Path, min_bytes: int) -> Secret:
    ref = read_ref(node)
    if ref.source == "file":
        note(base / ref.name)
    try:
        value = from_env(ref.name, env) if ref.source == "env" else from_file(base / ref.name)
    except SecretError as exc:
        node.fail(str(exc))
    if len(value) < min_bytes:
        node.fail(f"the secret in {ref} must be at least {min_bytes} bytes")
    return Secret(ref, value)
