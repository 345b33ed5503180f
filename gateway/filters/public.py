"""Public: the leading parts of the request that our backend may cache in public namespaces,
from the policy's declared prefixes and the messages the tenant marks public.

Invariant: a tenant the policy does not let mark its messages public gets 400 for the header,
never a silent share; a backend kind that cannot split a salt gets no public part (the request
stays in the tenant's namespace); a request-scoped tenant gets none.
"""

from __future__ import annotations

import re
from typing import Final

from aiohttp import web

from gateway.errors import PublicMarkRefused
from gateway.inputs.paths import CHAT
from gateway.policy.prefixes import MARK_HEADER, marked, match_chat, match_prompt, plain_messages
from gateway.policy.tenant_model import Scope
from gateway.state import BODY, NAMESPACE, PUBLIC, ROUTE, RUNTIME, TENANT
from kvfence.public import PublicPart

_COUNT_RE: Final = re.compile(r"[0-9]{1,4}")


def _mark_count(request: web.Request, messages: int) -> int:
    values = request.headers.getall(MARK_HEADER, [])
    if not values:
        return 0
    tenant = request[TENANT]
    if not tenant.public.own:
        raise PublicMarkRefused(f"{MARK_HEADER}: this tenant may not mark messages public")
    if request.path != CHAT:
        raise PublicMarkRefused(f"{MARK_HEADER} applies to chat completions only")
    value = values[0].strip()
    # ASCII digits only: str.isdigit also accepts characters int() refuses (a 500, not a 400)
    if len(values) != 1 or not _COUNT_RE.fullmatch(value) or not 1 <= int(value) <= messages:
        raise PublicMarkRefused(f"{MARK_HEADER} is one count of leading messages, 1 to {messages}")
    return int(value)


async def split_public(request: web.Request) -> None:
    body, route, tenant, runtime = request[BODY], request[ROUTE], request[TENANT], request[RUNTIME]
    messages = plain_messages(body.get("messages")) if request.path == CHAT else []
    count = _mark_count(request, len(messages))
    request[PUBLIC] = ()
    if not route.adapter.splits_public or tenant.scope is Scope.REQUEST:
        return
    parts: list[PublicPart] = []
    prefixes = runtime.public_prefixes.get(route.model.name, ())
    if tenant.public.declared and prefixes:
        if request.path == CHAT:
            found = match_chat(messages, prefixes)
        else:
            found = match_prompt(body.get("prompt"), prefixes)
        if found is not None:
            ns = runtime.public_namespace(route)
            parts.append(PublicPart(ns, *found, runtime.public_share))
    own = marked(messages, count) if count else None
    if count and own is None:
        raise PublicMarkRefused(f"{MARK_HEADER}: the marked messages must be plain text")
    if own is not None and (not parts or own[:2] > parts[-1].extent):
        ns = runtime.public_namespace(route, tenant)
        if ns != request[NAMESPACE]:
            parts.append(PublicPart(ns, *own, runtime.shares[tenant.id]))
    request[PUBLIC] = tuple(parts)
