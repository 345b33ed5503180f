"""Where our backend splits a prompt between public namespaces and the request's own: only whole
blocks of the granted content rendered alone, after checking its digest; a template that moves
text around makes nothing public; a grant the body does not carry refuses the request."""

from __future__ import annotations

import pytest

from backend.engine.plan import SamplingParams
from backend.engine.sequence import Segment
from backend.errors import handle_status
from backend.model.tokenizer import Tokenizer
from backend.openai_api import GenerationRequest
from backend.prompt import chat_prompt_ids, special_strings
from backend.public import public_segments
from kvfence.capability import _mint
from kvfence.handle_errors import HandleForbidden
from kvfence.public import PublicGrant, chat_digest, text_digest

P = _mint("public-ns")
Q = _mint("tenant-own-public")
BS = 16
SYSTEM = "You answer questions about Example Corp's refund policy, kindly."  # 64 bytes
# Mistral-like: the system prompt is rendered inside the last user turn, after earlier turns.
MOVING = (
    "{% for m in messages %}{% if m['role'] == 'user' %}[INST] "
    "{% if loop.last %}{{ messages[0]['content'] }} {% endif %}{{ m['content'] }} [/INST]"
    "{% elif m['role'] == 'assistant' %}{{ m['content'] }}{% endif %}{% endfor %}"
)


def chat(*messages: tuple[str, str]) -> GenerationRequest:
    msgs = tuple({"role": r, "content": c} for r, c in messages)
    return GenerationRequest("chat", "m", msgs, "", SamplingParams(), (), False, False)


def grant(req: GenerationRequest, messages: int, chars: int, ns: object = P) -> PublicGrant:
    public = [(m["role"], m["content"]) for m in req.messages[:messages]]
    public[-1] = (public[-1][0], public[-1][1][:chars])
    return PublicGrant(ns, messages, chars, chat_digest(public))  # type: ignore[arg-type]


def split(tok: Tokenizer, req: GenerationRequest, *grants: PublicGrant) -> tuple[Segment, ...]:
    specials = special_strings(tok)
    prompt = (
        chat_prompt_ids(tok, req.messages, specials) if req.messages else tok.encode(req.prompt)
    )
    return public_segments(tok, specials, req, prompt, grants, BS)


def test_the_declared_system_prompt_gives_its_whole_blocks(tiny_tokenizer: Tokenizer) -> None:
    req = chat(("system", SYSTEM), ("user", "Can I return a chair?"))
    # <|im_start|> + "system\n" + 64 bytes = 72 tokens: 4 whole blocks of 16
    assert split(tiny_tokenizer, req, grant(req, 1, len(SYSTEM))) == (Segment(P, 4),)


def test_a_system_message_that_starts_with_the_prompt_shares_only_that(
    tiny_tokenizer: Tokenizer,
) -> None:
    req = chat(("system", SYSTEM + " The customer is Alice Example."), ("user", "hi"))
    assert split(tiny_tokenizer, req, grant(req, 1, len(SYSTEM))) == (Segment(P, 4),)


def test_special_strings_in_private_text_change_nothing(tiny_tokenizer: Tokenizer) -> None:
    req = chat(("system", SYSTEM), ("user", "hi <|im_end|> there"))
    assert split(tiny_tokenizer, req, grant(req, 1, len(SYSTEM))) == (Segment(P, 4),)


def test_a_tenants_own_public_messages_follow_the_declared_ones(
    tiny_tokenizer: Tokenizer,
) -> None:
    req = chat(
        ("system", SYSTEM), ("user", "Here is our catalogue: " + "chairs, " * 8), ("user", "?")
    )
    first, second = grant(req, 1, len(SYSTEM)), grant(req, 2, len(req.messages[1]["content"]), Q)
    segments = split(tiny_tokenizer, req, first, second)
    assert segments[0] == Segment(P, 4) and segments[1].namespace == Q
    # 72 tokens, then <|im_end|> "\n" <|im_start|> "user\n" and the 87 bytes of the second message
    assert segments[1].end == (72 + 1 + 1 + 1 + 5 + 87) // BS


def test_a_template_that_moves_the_prompt_makes_nothing_public(
    tiny_tokenizer: Tokenizer,
) -> None:
    moving = Tokenizer(tiny_tokenizer.inner, None, (256,), MOVING)
    req = chat(("system", SYSTEM), ("user", "secret order 4411 " * 4), ("user", "next"))
    assert split(moving, req, grant(req, 1, len(SYSTEM))) == ()


def test_the_completion_prompts_public_head(tiny_tokenizer: Tokenizer) -> None:
    req = GenerationRequest("completion", "m", (), SYSTEM + " Q: chairs?", SamplingParams(),
                            (), False, False)  # fmt: skip
    good = PublicGrant(P, 0, len(SYSTEM), text_digest(SYSTEM))
    assert split(tiny_tokenizer, req, good) == (Segment(P, 64 // BS),)


@pytest.mark.parametrize(
    ("messages", "chars", "digest_of"),
    [
        (1, len(SYSTEM), "You answer"),  # another content than the body's
        (3, 2, None),  # more messages than the body has
        (1, len(SYSTEM) + 99, None),  # longer than the message
    ],
)
def test_a_grant_the_body_does_not_carry_refuses_the_request(
    tiny_tokenizer: Tokenizer, messages: int, chars: int, digest_of: str | None
) -> None:
    req = chat(("system", SYSTEM), ("user", "hi"))
    digest = chat_digest([("system", digest_of or SYSTEM)])
    with pytest.raises(HandleForbidden) as err:
        split(tiny_tokenizer, req, PublicGrant(P, messages, chars, digest))
    assert err.value.code == "public_mismatch" and handle_status(err.value) == 403
