"""Secret references: `{env: NAME}` or `{file: PATH}` (relative to the policy's folder).

Invariant: a secret is never written inline in a policy; a missing or empty one is an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from gateway.policy import Secret, SecretRef
from gateway.policy_yaml import Node

_KEYS = frozenset({"env", "file"})


def read_ref(node: Node) -> SecretRef:
    fields = node.mapping(frozenset(), _KEYS)
    if len(fields) != 1:
        node.fail("must be {env: NAME} or {file: PATH}; secrets are never written inline")
    ((source, value),) = fields.items()
    return SecretRef(source, value.text())


def resolve(node: Node, env: Mapping[str, str], base: Path, min_bytes: int) -> Secret:
    ref = read_ref(node)
    if ref.source == "env":
        text = env.get(ref.name, "")
        if not text:
            node.fail(f"environment variable {ref.name} is not set")
        value = text.encode("utf-8")
    else:
        path = base / ref.name
        try:
            value = path.read_bytes().rstrip(b"\r\n")
        except OSError as exc:
            node.fail(f"cannot read secret file {ref.name}: {exc.strerror}")
    if len(value) < min_bytes:
        node.fail(f"the secret in {ref} must be at least {min_bytes} bytes")
    return Secret(ref, value)
