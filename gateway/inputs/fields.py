"""The body allowlist's lists: the OpenAI request fields per path, the message and content-part
keys, the extra fields each backend kind may be allowed (policy `backends[].extra_fields`), and
the fields no policy can allow. docs/policy.md prints every list; keep the two in step.

Invariant: NEVER and every kind's ALLOWABLE list are disjoint, and no path's OpenAI list holds a
NEVER name, so a field that names blocks, engines, hosts, sessions, request ids, previous
responses, multimodal cache ids or a cache scope cannot reach a backend whatever the policy says.
"""

from __future__ import annotations

from typing import Final

from gateway.inputs.paths import CHAT, COMPLETIONS, DETOKENIZE, EMBEDDINGS, RESPONSES, TOKENIZE

_F = frozenset
# `openai` 3.57 `types`: chat `completion_create_params`, `completion_create_params`,
# `responses.response_create_params`, `embedding_create_params`, plus `stream`. The
# cache-scoping ones (`prompt_cache_*`) are in NEVER instead; `prompt_cache_key` reaches the
# namespace step through filters.scrub.
OPENAI: Final[dict[str, frozenset[str]]] = {
    CHAT: _F({"audio", "frequency_penalty", "function_call", "functions", "logit_bias",
              "logprobs", "max_completion_tokens", "max_tokens", "messages", "metadata",
              "modalities", "model", "moderation", "n", "parallel_tool_calls", "prediction",
              "presence_penalty", "reasoning_effort", "response_format", "safety_identifier",
              "seed", "service_tier", "stop", "store", "stream", "stream_options",
              "temperature", "tool_choice", "tools", "top_logprobs", "top_p", "user",
              "verbosity", "web_search_options"}),
    COMPLETIONS: _F({"best_of", "echo", "frequency_penalty", "logit_bias", "logprobs",
                     "max_tokens", "model", "n", "presence_penalty", "prompt", "seed", "stop",
                     "stream", "stream_options", "suffix", "temperature", "top_p", "user"}),
    RESPONSES: _F({"background", "include", "input", "instructions", "max_output_tokens",
                   "max_tool_calls", "metadata", "model", "parallel_tool_calls", "prompt",
                   "reasoning", "safety_identifier", "service_tier", "store", "stream",
                   "stream_options", "temperature", "text", "tool_choice", "tools",
                   "top_logprobs", "top_p", "truncation", "user"}),
    EMBEDDINGS: _F({"dimensions", "encoding_format", "input", "model", "user"}),
    # vLLM's tokenizer endpoints (its `TokenizeRequest`, `DetokenizeRequest`): no cache.
    TOKENIZE: _F({"add_generation_prompt", "add_special_tokens", "continue_final_message",
                  "messages", "model", "prompt", "return_token_strs", "tools"}),
    DETOKENIZE: _F({"model", "tokens"}),
}  # fmt: skip

# Chat message keys, and per content-part type the keys a part keeps (the part's payload object
# keeps only the keys listed in PAYLOAD). A part of any other type is an unknown field.
MESSAGE: Final = _F({"role", "content", "name", "tool_calls", "tool_call_id", "function_call",
                     "refusal", "audio"})  # fmt: skip
PARTS: Final[dict[str, frozenset[str]]] = {
    "text": _F({"type", "text"}),
    "image_url": _F({"type", "image_url"}),
    "input_audio": _F({"type", "input_audio"}),
    "file": _F({"type", "file"}),
    "refusal": _F({"type", "refusal"}),
    # the Responses API's input items
    "input_text": _F({"type", "text"}),
    "input_image": _F({"type", "image_url", "file_id", "detail"}),
    "input_file": _F({"type", "file_data", "file_id", "file_url", "filename"}),
    "output_text": _F({"type", "text", "annotations", "logprobs"}),
}
PAYLOAD: Final[dict[str, frozenset[str]]] = {
    "image_url": _F({"url", "detail"}),
    "input_audio": _F({"data", "format"}),
    "file": _F({"file_data", "file_id", "filename"}),
}
# Responses input items that point at stored state (a previous response's items).
STORED_ITEMS: Final = _F({"item_reference"})

# Never forwarded, whatever the policy: a cache scope, blocks, engines, hosts, sessions,
# request ids, previous responses, multimodal cache ids (dotted: inside that object).
NEVER: Final = _F({
    # cache scope (the adapter writes the one scoping field itself)
    "cache_salt", "extra_key", "prompt_cache_key", "prompt_cache_options",
    "prompt_cache_retention",
    # blocks, engines, hosts: disaggregated prefill and worker or slot selection
    "kv_transfer_params", "ec_transfer_params", "disaggregated_params", "bootstrap_host",
    "bootstrap_port", "bootstrap_room", "data_parallel_rank", "id_slot", "slot_id",
    "n_cache_reuse", "nvext.backend_instance_id", "nvext.worker_id",
    "nvext.prefill_worker_id", "nvext.decode_worker_id",
    # sessions
    "session_id", "session_params", "nvext.session_control", "conversation",
    # request ids
    "request_id", "rid",
    # previous responses
    "previous_response_id", "previous_input_messages",
    # multimodal cache ids
    "uuid", "content_hash", "multi_modal_uuids", "mm_hashes",
})  # fmt: skip

_SAMPLING = _F({"top_k", "min_p", "repetition_penalty", "min_tokens", "stop_token_ids",
                "ignore_eos", "skip_special_tokens"})  # fmt: skip
# What `backends[].extra_fields` may name, per kind. Deliberately absent everywhere (not
# allowable): server-side code or templates (`chat_template`, `vllm_xargs`,
# `custom_logit_processor`, `mm_processor_kwargs`, `media_io_kwargs`), adapter selection
# (`lora_path`, `lora_request`) and raw multimodal payloads (`mm_payload`, `prompt_embeds`).
ALLOWABLE: Final[dict[str, frozenset[str]]] = {
    "vllm": _SAMPLING | {"length_penalty", "include_stop_str_in_output",
                         "spaces_between_special_tokens", "truncate_prompt_tokens",
                         "prompt_logprobs", "allowed_token_ids", "bad_words",
                         "structured_outputs", "add_generation_prompt",
                         "continue_final_message", "add_special_tokens", "chat_template_kwargs",
                         "include_reasoning", "return_token_ids", "return_tokens_as_token_ids",
                         "use_beam_search", "documents", "priority", "thinking_token_budget",
                         "echo"},
    "sglang": _SAMPLING | {"no_stop_trim", "regex", "ebnf", "json_schema",
                           "separate_reasoning", "stream_reasoning", "chat_template_kwargs",
                           "continue_final_message", "priority"},
    "trtllm": _SAMPLING | {"length_penalty", "include_stop_str_in_output",
                           "spaces_between_special_tokens", "add_special_tokens",
                           "add_generation_prompt"},
    "dynamo": _SAMPLING | {"nvext.ignore_eos", "nvext.top_k", "nvext.repetition_penalty",
                           "nvext.greed_sampling", "nvext.annotations"},
    "kvfence": _F({"ignore_eos"}),
    "tgi": _F({"top_k", "repetition_penalty"}),
    "llamacpp": _F({"top_k", "min_p", "repeat_penalty", "typical_p", "mirostat",
                    "mirostat_tau", "mirostat_eta", "cache_prompt"}),
    "openai": _F(),
}  # fmt: skip

# Every name above: the bounded set a dropped field is counted under (anything else: "other").
KNOWN: Final = (
    _F().union(*OPENAI.values(), *ALLOWABLE.values(), NEVER, MESSAGE)
    | {f"{where}.{k}" for where in ("messages", "messages.content", "input.content") for k in NEVER}
    | {"messages.content", "input.content", "input"}
)


def extra_field_problem(kind: str, name: str) -> str | None:
    """Why `name` cannot be an extra field of a `kind` backend, or None when it can."""
    if name in NEVER:
        return (
            f"{name} is never forwarded: it names a cache scope, blocks, engines, hosts, a "
            "session, a request id, a previous response or a multimodal cache id"
        )
    if name not in ALLOWABLE.get(kind, _F()):
        allowed = ", ".join(sorted(ALLOWABLE.get(kind, _F()))) or "none"
        return f"{name} is not an extra field kind {kind} takes (allowable: {allowed})"
    return None
