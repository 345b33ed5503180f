"""A test helper that puts our backend behind plain HTTP for the probe: each request gets a
fresh signed handle for the raw namespace its `x-probe-namespace` header names (or, with
`fresh=True`, a new namespace every time, so nothing can ever hit), the way the gateway signs.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson

from backend.model.load import LoadedModel
from kvfence.handle import HANDLE_HEADER, HandleSigner
from kvfence.keys.keyfile import load_private_key
from tests.fakes.salt_dropping_proxy import Rewrite, RewritingProxy
from tests.kit.stack import AUDIENCE, Keys, make_backend, serve

NAMESPACE_HEADER = "x-probe-namespace"


def signing(keys: Keys, model: str, fresh: bool = False) -> Rewrite:
    signer = HandleSigner(load_private_key(keys.folder / "gateway.key"), "gateway")

    def rewrite(
        body: dict[str, Any], headers: dict[str, str]
    ) -> tuple[dict[str, Any], dict[str, str]]:
        named = headers.pop(NAMESPACE_HEADER, "default")
        namespace = "probe." + (uuid.uuid4().hex if fresh else named)
        # The proxy sends orjson.dumps(body): the same bytes, so the handle binds what it sends.
        sent = orjson.dumps(body)
        rid = uuid.uuid4().hex
        headers[HANDLE_HEADER] = signer.sign(namespace, model, "1", rid, AUDIENCE, body=sent)
        return body, headers

    return rewrite


@asynccontextmanager
async def backend_behind_proxy(
    loaded: LoadedModel, keys: Keys, *, fresh: bool = False, strip_usage: bool = False
) -> AsyncIterator[str]:
    """Our backend (in this process) behind the signing proxy; yields the proxy's URL."""
    runner, url = await serve(make_backend(loaded, keys))
    try:
        rewrite = signing(keys, loaded.name, fresh)
        async with RewritingProxy(url, rewrite, strip_usage) as proxy:
            yield proxy.url
    finally:
        await runner.cleanup()
