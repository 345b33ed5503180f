"""Reading the policy's `public` section (declared public prefixes and their KV capacity) and a
tenant's `public` settings.

Invariant: a declared prefix names a served model, has non-empty text in every message, and its
file is read once, here; nothing is ever made public by counting who sent it.
"""

from __future__ import annotations

import re
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Final

from gateway.policy.node import Node, optional, unique_items
from gateway.policy.sources import note
from gateway.policy.tenant_model import PublicPrefix, PublicSettings, Scope, TenantPublic

_F = frozenset
_NAME_RE: Final = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_ROLES: Final = ("system", "user", "assistant", "developer")
MAX_PREFIX_BYTES: Final = 1 << 20


def _content(f: dict[str, Node], node: Node, base: Path) -> str:
    """`text: ...` or `file: PATH` (relative to the policy's folder; one trailing newline, as
    editors save files, is not part of the prompt)."""
    if ("text" in f) == ("file" in f):
        node.fail("needs exactly one of text or file")
    if "text" in f:
        text = str(f["text"].text())
    else:
        name = f["file"].text()
        note(base / name)
        try:
            data = (base / name).read_bytes()
        except OSError as exc:
            f["file"].fail(f"cannot read {name}: {exc.strerror}")
        if len(data) > MAX_PREFIX_BYTES:
            f["file"].fail(f"{name} is larger than {MAX_PREFIX_BYTES} bytes")
        try:
            text = data.decode("utf-8").removesuffix("\n").removesuffix("\r")
        except UnicodeDecodeError:
            f["file"].fail(f"{name} is not UTF-8 text")
    if not text or len(text.encode("utf-8", "surrogatepass")) > MAX_PREFIX_BYTES:
        node.fail(f"the text must be non-empty and at most {MAX_PREFIX_BYTES} bytes")
    return text


def _message(node: Node, base: Path) -> tuple[str, str]:
    f = node.mapping(_F({"role"}), _F({"text", "file"}))
    role = f["role"].choice(_ROLES)
    return ("system" if role == "developer" else role), _content(f, node, base)


def _prefix(node: Node, served: set[str], base: Path) -> PublicPrefix:
    f = node.mapping(_F({"name", "model"}), _F({"text", "file", "messages"}))
    name = f["name"].text(_NAME_RE, "of [A-Za-z0-9._-], at most 64")
    model = f["model"].text()
    if model not in served:
        f["model"].fail(f"no backend serves model {model}")
    if "messages" in f:
        if "text" in f or "file" in f:
            node.fail("give messages, or one text or file, not both")
        items = f["messages"].items()
        if not items:
            f["messages"].fail("must list at least one message")
        return PublicPrefix(name, model, tuple(_message(m, base) for m in items))
    text = _content(f, node, base)
    return PublicPrefix(name, model, (("system", text),), text)


def read_public(node: Node, served: set[str], base: Path) -> PublicSettings:
    f = node.mapping(_F(), _F({"prefixes", "cache"}))
    c = f["cache"].mapping(_F(), _F({"ceiling", "floor"})) if "cache" in f else {}
    settings = PublicSettings(
        **optional(c, ceiling=lambda n: n.number(0.01, 1.0), floor=lambda n: n.number(0.0, 1.0))
    )
    if "floor" not in c:  # the default floor never exceeds a lower ceiling
        settings = replace(settings, floor=min(settings.floor, settings.ceiling))
    elif settings.floor > settings.ceiling:
        c["floor"].fail(f"must not exceed the ceiling ({settings.ceiling:g})")
    if "prefixes" in f:
        read = partial(_prefix, served=served, base=base)
        prefixes = unique_items(f["prefixes"], read, lambda p: p.name, "public prefix name")
        settings = replace(settings, prefixes=prefixes)
    return settings


def read_tenant_public(node: Node | None, scope: Scope) -> TenantPublic:
    """A tenant's `public: {declared, own}` (None: not given); scope `request` reuses nothing,
    public included, so it declares nothing unless told to (and then it is refused)."""
    f = node.mapping(_F(), _F({"declared", "own"})) if node is not None else {}
    public = TenantPublic(**optional(f, declared=Node.boolean, own=Node.boolean))
    if scope is Scope.REQUEST and "declared" not in f:
        public = replace(public, declared=False)
    if node is not None and scope is Scope.REQUEST and (public.declared or public.own):
        node.fail("scope request reuses nothing: no public prefixes")
    return public
