"""Public prefixes at our backend: which leading blocks of a prompt go to the public namespaces
its handle grants. Decided here, from the body the handle is bound to, never taken on trust.

Invariant: a block lands in a public namespace only when the grant's content, cut from this
body, hashes to the digest the gateway signed, and every token up to the end of that block is a
token of that content rendered alone (the template sees nothing else); all other blocks stay in
the request's own namespace. A digest that does not match refuses the request.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from backend.engine.sequence import Segment
from backend.model.tokenizer import Tokenizer
from backend.openai_api import GenerationRequest
from backend.prompt import UnsafeTemplate, has_specials, public_chat_ids
from kvfence.handle_errors import HandleForbidden
from kvfence.public import PublicGrant, chat_digest, text_digest


def _mismatch(detail: str) -> HandleForbidden:
    return HandleForbidden("public_mismatch", detail)


def _chat_ids(
    tokenizer: Tokenizer, specials: tuple[str, ...], req: GenerationRequest, grant: PublicGrant
) -> list[int]:
    if not 1 <= grant.messages <= len(req.messages):
        raise _mismatch("the public part names messages the body does not have")
    public = [dict(m) for m in req.messages[: grant.messages]]
    if grant.chars > len(public[-1]["content"]):
        raise _mismatch("the public part is longer than its message")
    public[-1]["content"] = public[-1]["content"][: grant.chars]
    digest = chat_digest([(m["role"], m["content"]) for m in public])
    if not hmac.compare_digest(digest, grant.digest):
        raise _mismatch("the public part is not the content the gateway declared")
    try:
        return public_chat_ids(tokenizer, public, has_specials(req.messages, specials))
    except UnsafeTemplate:
        return []  # the template cannot render it apart: nothing is public


def _text_ids(tokenizer: Tokenizer, req: GenerationRequest, grant: PublicGrant) -> list[int]:
    if grant.messages != 0 or grant.chars > len(req.prompt):
        raise _mismatch("the public part does not fit the prompt")
    text = req.prompt[: grant.chars]
    if not hmac.compare_digest(text_digest(text), grant.digest):
        raise _mismatch("the public part is not the content the gateway declared")
    return tokenizer.encode(text)


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def public_segments(
    tokenizer: Tokenizer,
    specials: tuple[str, ...],
    req: GenerationRequest,
    prompt: Sequence[int],
    grants: Sequence[PublicGrant],
    block_size: int,
) -> tuple[Segment, ...]:
    """The leading public segments of `prompt` (HandleForbidden `public_mismatch` when a
    grant's content is not in the body): each grant's whole blocks that the prompt shares with
    the grant's content rendered alone, past the blocks of the grants before it."""
    segments: list[Segment] = []
    done = 0
    for grant in grants:
        if req.endpoint == "chat":
            ids = _chat_ids(tokenizer, specials, req, grant)
        else:
            ids = _text_ids(tokenizer, req, grant)
        end = _common(ids, prompt) // block_size
        if end > done:
            segments.append(Segment(grant.namespace, end))
            done = end
    return tuple(segments)
