"""Public prefixes at the gateway: which leading part of a request is public, from the policy's
declared prefixes (matched on the request's messages or completion prompt) and from the leading
messages a tenant marks public in `x-kvfence-public-messages`.

Invariant: only text that equals a declared prefix (every message whole, the last one as the
start of the request's message), or that the tenant itself marked, becomes a `PublicPart`; a
tenant's own parts live in a namespace derived from its id, so no other tenant can read them.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from gateway.adapters.kinds import ADAPTERS
from gateway.policy.backend_model import Backend
from gateway.policy.model import Policy
from gateway.policy.tenant_model import PublicPrefix
from kvfence.public import chat_digest, text_digest

MARK_HEADER: Final = "x-kvfence-public-messages"
Message = tuple[str, str]


def plain_messages(messages: Any) -> list[Message | None]:
    """Each chat message as our backend reads it, (role, text), or None where it is not plain
    text (then nothing from it on can match)."""
    out: list[Message | None] = []
    for m in messages if isinstance(messages, list) else ():
        role = m.get("role") if isinstance(m, dict) else None
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):
            texts = [p.get("text") if isinstance(p, dict) and p.get("type") == "text" else None
                     for p in content]  # fmt: skip
            content = "".join(texts) if all(isinstance(t, str) for t in texts) else None  # type: ignore[arg-type]
        if not isinstance(role, str) or not isinstance(content, str):
            out.append(None)
            continue
        out.append(("system" if role == "developer" else role, content))
    return out


def _starts(messages: Sequence[Message | None], prefix: PublicPrefix) -> bool:
    head = prefix.messages
    if len(messages) < len(head):
        return False
    for i, (role, content) in enumerate(head):
        got = messages[i]
        if got is None or got[0] != role:
            return False
        last = i == len(head) - 1
        if got[1] != content and not (last and got[1].startswith(content)):
            return False
    return True


def match_chat(
    messages: Sequence[Message | None], prefixes: Sequence[PublicPrefix]
) -> tuple[int, int, str] | None:
    """The longest declared prefix the chat starts with, as (messages, characters of the last
    of them, digest), or None. `prefixes` longest first."""
    for prefix in prefixes:
        if _starts(messages, prefix):
            return len(prefix.messages), len(prefix.messages[-1][1]), chat_digest(prefix.messages)
    return None


def match_prompt(prompt: Any, prefixes: Sequence[PublicPrefix]) -> tuple[int, int, str] | None:
    """The longest declared text a completion prompt starts with, as (0, characters, digest)."""
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        return None
    for prefix in prefixes:
        if prefix.text is not None and prompt.startswith(prefix.text):
            return 0, len(prefix.text), text_digest(prefix.text)
    return None


def marked(messages: Sequence[Message | None], count: int) -> tuple[int, int, str] | None:
    """The tenant's own first `count` messages as a public part, or None when one of them is
    not plain text."""
    head = messages[:count]
    if len(head) != count or any(m is None for m in head):
        return None
    plain = [m for m in head if m is not None]
    return count, len(plain[-1][1]), chat_digest(plain)


def backend_status(policy: Policy, backend: Backend) -> str | None:
    """What /status says about a backend's public prefixes, or None when none concern it."""
    models = {m.name for m in backend.models}
    declared = any(p.model in models for p in policy.public.prefixes)
    own = any(t.public.own and set(t.models) & models for t in policy.tenants)
    if not (declared or own):
        return None
    if ADAPTERS[backend.kind].splits_public:
        return "applied"
    return (
        f"not applied: a {backend.kind} backend takes one cache salt per request and cannot "
        "split it mid-prompt, so these requests stay isolated in the tenant's namespace"
    )
