"""The body allowlist's lists that hold for every backend kind: the OpenAI request fields per
path, the message and content-part keys, the fields never forwarded because they could select or
widen a cache scope (NEVER), and the known fields refused for another reason (REFUSED). The
per-kind lists are in gateway.inputs.kinds. docs/policy.md prints every list; keep them in step.

Invariant: no path's OpenAI list holds a NEVER or REFUSED name, so a field that names blocks,
engines, hosts, sessions, request ids, previous responses, multimodal cache ids or a cache scope
cannot reach a backend whatever the policy says.
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
                     "refusal", "audio", "annotations", "reasoning",
                     "reasoning_content"})  # fmt: skip
PARTS: Final[dict[str, frozenset[str]]] = {
    "text": _F({"type", "text"}),
    "image_url": _F({"type", "image_url"}),
    "input_audio": _F({"type", "input_audio"}),
    "file": _F({"type", "file"}),
    "refusal": _F({"type", "refusal"}),
    # vLLM's and SGLang's media parts (by URL or data URL)
    "video_url": _F({"type", "video_url"}),
    "audio_url": _F({"type", "audio_url"}),
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
    "video_url": _F({"url"}),
    "audio_url": _F({"url"}),
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

# Known names never forwarded to any backend, though they name no scope, each with why: a
# template or code the server would run, adapter selection, raw embeddings. The audit fingerprints
# the prompt the server caches from the request; with these it could not, and a cross-tenant hit
# would pass unseen. (Dotted: inside that object.)
REFUSED: Final[dict[str, str]] = {
    "chat_template": "a template the server would run instead of the model's own",
    "vllm_xargs": "arguments to code the server would run",
    "custom_logit_processor": "code the server would run",
    "custom_params": "arguments to code the server would run",
    "mm_processor_kwargs": "options of the server's multimodal processor",
    "media_io_kwargs": "options of the server's media loaders",
    "mm_payload": "a raw multimodal payload",
    "prompt_embeds": "raw prompt embeddings",
    "lora_path": "it selects an adapter",
    "lora_request": "it selects an adapter",
}

# Every name above, but the per-kind lists (gateway.inputs.kinds adds those): the bounded set a
# field is counted under (anything else: "other").
KNOWN_HERE: Final = (
    _F().union(*OPENAI.values(), NEVER, MESSAGE, REFUSED)
    | {f"{where}.{k}" for where in ("messages", "messages.content", "input.content") for k in NEVER}
    | {"messages.content", "input.content", "input"}
)
