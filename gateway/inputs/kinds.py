"""What each backend kind's server documents beyond OpenAI's fields, and what the gateway does
with it: FORWARD (forwarded by default: it cannot select or widen a cache scope), HELD (forwarded
only when the policy lists it in `backends[].extra_fields`: it reaches past the request, such as
scheduling priority over other tenants). Names in `fields.NEVER` or `fields.REFUSED` are in
neither. docs/policy.md prints every list; keep the two in step.

Invariant: for every kind and path, FORWARD and HELD hold no NEVER or REFUSED name.
"""

from __future__ import annotations

from typing import Final

from gateway.inputs import fields
from gateway.inputs.paths import CHAT, COMPLETIONS, DETOKENIZE, EMBEDDINGS, RESPONSES, TOKENIZE

_F = frozenset
_ALL: Final = (CHAT, COMPLETIONS, RESPONSES, EMBEDDINGS, TOKENIZE, DETOKENIZE)

# vLLM 0.32's request types (`ChatCompletionRequest`, `CompletionRequest`, `ResponsesRequest`,
# `EmbeddingCompletionRequest` and `EmbeddingChatRequest`, `TokenizeCompletionRequest` and
# `TokenizeChatRequest`), less OpenAI's fields and NEVER, REFUSED and HELD names.
_VLLM_SAMPLING = _F({"top_k", "min_p", "repetition_penalty", "min_tokens", "stop_token_ids",
                     "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
                     "include_stop_str_in_output", "allowed_token_ids", "bad_words",
                     "structured_outputs", "thinking_token_budget", "watermarking",
                     "repetition_detection"})  # fmt: skip
_VLLM_GENERATE = _VLLM_SAMPLING | {
    "add_special_tokens", "echo", "length_penalty", "logprob_token_ids", "prompt_logprobs",
    "response_format", "return_mm_kwargs", "return_token_ids", "return_token_offsets",
    "return_tokens_as_token_ids", "routed_experts_prompt_start", "stream_interval",
    "truncate_prompt_tokens", "truncation_side", "use_beam_search",
}  # fmt: skip
_VLLM_CHAT_TEMPLATE = _F({"add_generation_prompt", "chat_template_kwargs",
                          "continue_final_message", "documents"})  # fmt: skip
VLLM: Final[dict[str, frozenset[str]]] = {
    CHAT: _VLLM_GENERATE | _VLLM_CHAT_TEMPLATE | {"include_reasoning", "return_prompt_text"},
    COMPLETIONS: _VLLM_GENERATE,
    RESPONSES: _VLLM_SAMPLING | {"chat_template_kwargs", "enable_response_messages",
                                 "frequency_penalty", "include_reasoning", "logit_bias",
                                 "presence_penalty", "return_mm_kwargs", "seed", "stop"},
    EMBEDDINGS: _VLLM_CHAT_TEMPLATE - {"documents"} | {
        "add_special_tokens", "embed_dtype", "endianness", "messages", "padding",
        "truncate_prompt_tokens", "truncation_side", "use_activation"},
    TOKENIZE: _F({"chat_template_kwargs"}),
    DETOKENIZE: _F(),
}  # fmt: skip

# SGLang's OpenAI-compatible request types (`sglang.srt.entrypoints.openai.protocol`).
_SGLANG = _F({"top_k", "min_p", "repetition_penalty", "min_tokens", "stop_token_ids",
              "ignore_eos", "skip_special_tokens", "no_stop_trim", "regex", "ebnf", "json_schema",
              "separate_reasoning", "stream_reasoning", "chat_template_kwargs",
              "continue_final_message", "spaces_between_special_tokens", "return_hidden_states",
              "echo", "sampling_seed"})  # fmt: skip
# TensorRT-LLM's `trtllm-serve` request types (`tensorrt_llm.serve.openai_protocol`).
_TRTLLM = _F({"top_k", "min_p", "repetition_penalty", "min_tokens", "stop_token_ids",
              "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
              "include_stop_str_in_output", "length_penalty", "use_beam_search", "early_stopping",
              "top_p_min", "truncate_prompt_tokens", "add_special_tokens",
              "add_generation_prompt", "chat_template_kwargs", "documents", "echo",
              "prompt_logprobs", "return_context_logits", "return_generation_logits"})  # fmt: skip
_DYNAMO = _F({"top_k", "min_p", "repetition_penalty", "min_tokens", "stop_token_ids",
              "ignore_eos", "skip_special_tokens", "nvext.ignore_eos", "nvext.top_k",
              "nvext.repetition_penalty", "nvext.greed_sampling", "nvext.annotations"})  # fmt: skip
_LLAMACPP = _F({"top_k", "min_p", "repeat_penalty", "typical_p", "mirostat", "mirostat_tau",
                "mirostat_eta", "cache_prompt"})  # fmt: skip


def _every_path(names: frozenset[str]) -> dict[str, frozenset[str]]:
    return dict.fromkeys(_ALL, names)


FORWARD: Final[dict[str, dict[str, frozenset[str]]]] = {
    "vllm": VLLM,
    "sglang": _every_path(_SGLANG),
    "trtllm": _every_path(_TRTLLM),
    "dynamo": _every_path(_DYNAMO),
    "kvfence": _every_path(_F({"ignore_eos"})),
    "tgi": _every_path(_F({"top_k", "repetition_penalty"})),
    "llamacpp": _every_path(_LLAMACPP),
    "max": _every_path(_F()),
    "openai": _every_path(_F()),
}
# Scheduling priority reaches other tenants' requests: forwarded only where the policy says so.
HELD: Final[dict[str, frozenset[str]]] = {"vllm": _F({"priority"}), "sglang": _F({"priority"})}
# Kinds whose whole request vocabulary is known (our backend's, OpenAI's): `extra_fields` may
# name only their HELD fields. Any other kind's server may take a field this gateway does not
# know yet; the policy may name it, at the operator's word that it cannot change the scope.
CLOSED: Final = _F({"kvfence", "openai"})

KNOWN: Final = fields.KNOWN_HERE.union(
    *(names for paths in FORWARD.values() for names in paths.values()), *HELD.values()
)


def forwarded(kind: str, path: str) -> frozenset[str]:
    """The names a `kind` backend gets by default on `path`, beyond OpenAI's."""
    return FORWARD.get(kind, {}).get(path, _F())


def held(kind: str) -> frozenset[str]:
    return HELD.get(kind, _F())


def extra_field_problem(kind: str, name: str) -> str | None:
    """Why `name` cannot be an extra field of a `kind` backend, or None when it can."""
    if name in fields.NEVER:
        return (
            f"{name} is never forwarded: it names a cache scope, blocks, engines, hosts, a "
            "session, a request id, a previous response or a multimodal cache id"
        )
    if name in fields.REFUSED:
        return f"{name} is not an extra field kind {kind} takes: {fields.REFUSED[name]}"
    if kind in CLOSED and name not in held(kind):
        allowed = ", ".join(sorted(held(kind))) or "none"
        return f"{name} is not an extra field kind {kind} takes (allowable: {allowed})"
    return None
