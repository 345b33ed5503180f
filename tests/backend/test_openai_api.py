"""OpenAI request parsing and response shapes: every bad field is a 400 naming that field, the
defaults are OpenAI's, and answers have the shapes OpenAI clients read."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from backend.errors import BadRequest
from backend.openai_api import GenerationRequest, parse_body, parse_generation
from backend.shapes import choice_body, chunk_body, completion_body, sse, usage, usage_chunk

MSG = [{"role": "user", "content": "hi"}]


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": MSG, **fields}


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": "Once upon a time", **fields}


def refused(body: dict[str, Any], endpoint: str = "chat") -> BadRequest:
    with pytest.raises(BadRequest) as info:
        parse_generation(body, endpoint)
    assert info.value.status == 400
    return info.value


# parse_body


@pytest.mark.parametrize("raw", [b"", b"{", b"{'model': 'm'}", b"\xff\xfe", b"nul"])
def test_malformed_json_is_a_bad_request(raw: bytes) -> None:
    with pytest.raises(BadRequest, match="not valid JSON"):
        parse_body(raw)


@pytest.mark.parametrize("raw", [b"[]", b"[{}]", b'"text"', b"42", b"null", b"true"])
def test_json_that_is_not_an_object_is_a_bad_request(raw: bytes) -> None:
    with pytest.raises(BadRequest, match="JSON object"):
        parse_body(raw)


def test_a_json_object_is_returned_as_a_dict() -> None:
    assert parse_body(b'{"model": "m", "n": 1}') == {"model": "m", "n": 1}


# parse_generation: what a valid request becomes


def test_chat_defaults_are_openais() -> None:
    req = parse_generation(chat(), "chat")
    assert req.endpoint == "chat" and req.model == "m"
    assert req.messages == ({"role": "user", "content": "hi"},) and req.prompt == ""
    assert req.sampling.max_tokens == 256
    assert req.sampling.temperature == 1.0 and req.sampling.top_p == 1.0
    assert req.sampling.seed is None
    assert req.stop == () and req.stream is False and req.include_usage is False
    assert req.ignore_eos is False


def test_completion_defaults_are_openais() -> None:
    req = parse_generation(completion(), "completion")
    assert req.endpoint == "completion" and req.prompt == "Once upon a time"
    assert req.messages == ()
    assert req.sampling.max_tokens == 256
    assert req.sampling.temperature == 1.0 and req.sampling.top_p == 1.0


def test_explicit_nulls_mean_the_defaults() -> None:
    body = chat(temperature=None, top_p=None, max_tokens=None, n=None, seed=None, stop=None)
    body |= {"stream": None, "stream_options": None, "ignore_eos": None}
    req = parse_generation(body, "chat")
    assert req.sampling.max_tokens == 256 and req.sampling.temperature == 1.0
    assert req.stop == () and req.stream is False and req.include_usage is False


def test_fields_a_client_sets_are_kept() -> None:
    body = chat(max_tokens=7, temperature=0, top_p=0.5, seed=42, stop="\n", stream=True, n=1)
    req = parse_generation(body, "chat")
    assert req.sampling.max_tokens == 7
    assert req.sampling.temperature == 0.0 and req.sampling.top_p == 0.5
    assert req.sampling.seed == 42
    assert req.stop == ("\n",) and req.stream is True


@pytest.mark.parametrize("endpoint", ["chat", "completion"])
def test_max_completion_tokens_is_preferred_over_max_tokens(endpoint: str) -> None:
    body = (chat if endpoint == "chat" else completion)(max_tokens=100, max_completion_tokens=9)
    assert parse_generation(body, endpoint).sampling.max_tokens == 9
    body = (chat if endpoint == "chat" else completion)(max_tokens=100)
    assert parse_generation(body, endpoint).sampling.max_tokens == 100


def test_a_null_max_completion_tokens_does_not_hide_max_tokens() -> None:
    req = parse_generation(chat(max_completion_tokens=None, max_tokens=5), "chat")
    assert req.sampling.max_tokens == 5


def test_max_completion_tokens_is_range_checked_under_its_own_name() -> None:
    assert refused(chat(max_completion_tokens=0)).param == "max_completion_tokens"


def test_limits_at_the_edges_of_their_ranges_are_accepted() -> None:
    req = parse_generation(chat(max_tokens=1, temperature=2, top_p=1), "chat")
    assert req.sampling.max_tokens == 1 and req.sampling.temperature == 2.0
    assert parse_generation(chat(max_tokens=4096), "chat").sampling.max_tokens == 4096


def test_developer_role_is_a_system_message() -> None:
    messages = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "system", "content": "x"},
    ]
    req = parse_generation(chat(messages=messages), "chat")
    assert [m["role"] for m in req.messages] == ["system", "user", "assistant", "system"]
    assert [m["content"] for m in req.messages] == ["be brief", "hi", "hello", "x"]


def test_text_content_parts_are_joined() -> None:
    parts = [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "world"}]
    req = parse_generation(chat(messages=[{"role": "user", "content": parts}]), "chat")
    assert req.messages == ({"role": "user", "content": "Hello, world"},)


def test_extra_message_fields_are_dropped() -> None:
    message = {"role": "user", "content": "hi", "name": "bob", "tool_calls": []}
    req = parse_generation(chat(messages=[message]), "chat")
    assert req.messages == ({"role": "user", "content": "hi"},)


def test_a_one_element_prompt_list_is_that_prompt() -> None:
    req = parse_generation(completion(prompt=["Once"]), "completion")
    assert req.prompt == "Once"


def test_a_stop_list_is_kept_in_order() -> None:
    req = parse_generation(chat(stop=["a", "bc", "\n\n", "END"]), "chat")
    assert req.stop == ("a", "bc", "\n\n", "END")


def test_stream_options_include_usage() -> None:
    body = chat(stream=True, stream_options={"include_usage": True})
    assert parse_generation(body, "chat").include_usage is True
    body = chat(stream=True, stream_options={"include_usage": False})
    assert parse_generation(body, "chat").include_usage is False
    assert parse_generation(chat(stream=True, stream_options={}), "chat").include_usage is False


def test_ignore_eos_is_read() -> None:
    assert parse_generation(chat(ignore_eos=True), "chat").ignore_eos is True
    assert parse_generation(completion(ignore_eos=False), "completion").ignore_eos is False


def test_the_request_is_frozen() -> None:
    req = parse_generation(chat(), "chat")
    with pytest.raises(AttributeError):
        req.model = "other"  # type: ignore[misc]


# parse_generation: what is refused, and the field it blames

BAD_FIELDS: list[tuple[dict[str, Any], str]] = [
    ({"model": ""}, "model"),
    ({"model": 3}, "model"),
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": 2.01}, "temperature"),
    ({"temperature": "0.7"}, "temperature"),
    ({"temperature": True}, "temperature"),
    ({"temperature": [1]}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_p": "1"}, "top_p"),
    ({"top_p": False}, "top_p"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": -5}, "max_tokens"),
    ({"max_tokens": 4097}, "max_tokens"),
    ({"max_tokens": "100"}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"),
    ({"max_completion_tokens": 10**6}, "max_completion_tokens"),
    ({"n": 9}, "n"),
    ({"n": 0}, "n"),
    ({"n": "1"}, "n"),
    ({"n": True}, "n"),
    ({"seed": 1.5}, "seed"),
    ({"seed": "7"}, "seed"),
    ({"seed": True}, "seed"),
    ({"stop": 5}, "stop"),
    ({"stop": ""}, "stop"),
    ({"stop": ["a", ""]}, "stop"),
    ({"stop": ["a", 1]}, "stop"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stop": {"a": 1}}, "stop"),
    ({"stream": "true"}, "stream"),
    ({"stream": 1}, "stream"),
    ({"stream_options": "include_usage"}, "stream_options"),
    ({"stream_options": [{"include_usage": True}]}, "stream_options"),
    ({"ignore_eos": "yes"}, "ignore_eos"),
    ({"ignore_eos": 1}, "ignore_eos"),
]


@pytest.mark.parametrize(("fields", "param"), BAD_FIELDS)
def test_a_bad_field_is_refused_naming_it_on_both_endpoints(
    fields: dict[str, Any], param: str
) -> None:
    assert refused(chat(**fields), "chat").param == param
    assert refused(completion(**fields), "completion").param == param


def test_missing_model_is_refused() -> None:
    assert refused({"messages": MSG}).param == "model"


@pytest.mark.parametrize(
    "messages",
    [
        None,
        [],
        "hi",
        {"role": "user", "content": "hi"},
        ["hi"],
        [{"role": "tool", "content": "x"}],
        [{"role": "User", "content": "x"}],
        [{"content": "x"}],
        [{"role": "user"}],
        [{"role": "user", "content": None}],
        [{"role": "user", "content": 5}],
        [{"role": "user", "content": "ok"}, {"role": "user", "content": {"text": "x"}}],
    ],
)
def test_bad_messages_are_refused_naming_messages(messages: Any) -> None:
    body = {"model": "m"} if messages is None else {"model": "m", "messages": messages}
    assert refused(body).param == "messages"


@pytest.mark.parametrize(
    "parts",
    [
        [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}],
        [{"type": "text", "text": "look:"}, {"type": "image_url", "image_url": {"url": "u"}}],
        [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}],
        [{"type": "text", "text": 3}],
        ["plain string part"],
    ],
)
def test_non_text_content_parts_are_refused(parts: list[Any]) -> None:
    error = refused(chat(messages=[{"role": "user", "content": parts}]))
    assert error.param == "messages" and "text" in error.message


@pytest.mark.parametrize("prompt", [None, "", [], ["a", "b"], [1, 2, 3], [[1, 2]], 7, [""]])
def test_bad_prompts_are_refused_naming_prompt(prompt: Any) -> None:
    body = {"model": "m"} if prompt is None else {"model": "m", "prompt": prompt}
    assert refused(body, "completion").param == "prompt"


def test_the_chat_endpoint_needs_messages_not_a_prompt() -> None:
    assert refused({"model": "m", "prompt": "hi"}, "chat").param == "messages"


def test_the_completion_endpoint_needs_a_prompt_not_messages() -> None:
    assert refused({"model": "m", "messages": MSG}, "completion").param == "prompt"


def test_a_non_boolean_include_usage_is_refused() -> None:
    body = chat(stream=True, stream_options={"include_usage": "false"})
    assert refused(body).param == "stream_options"


# response shapes


def request(endpoint: str) -> GenerationRequest:
    body = chat() if endpoint == "chat" else completion()
    return parse_generation(body, endpoint)


def test_usage_counts_totals_and_cached_tokens() -> None:
    assert usage(10, 3, 8) == {
        "prompt_tokens": 10,
        "completion_tokens": 3,
        "total_tokens": 13,
        "prompt_tokens_details": {"cached_tokens": 8},
    }


def test_chat_completion_body() -> None:
    use = usage(5, 2, 4)
    req = request("chat")
    body = completion_body(req, "chatcmpl-1", [choice_body(req, 0, "Hello", "stop")], use)
    assert body["id"] == "chatcmpl-1" and body["object"] == "chat.completion"
    assert body["model"] == "m" and isinstance(body["created"], int) and body["created"] > 0
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello"},
            "finish_reason": "stop",
            "logprobs": None,
        }
    ]
    assert body["usage"] == use
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 4


def test_text_completion_body() -> None:
    use = usage(5, 2, 0)
    req = request("completion")
    body = completion_body(req, "cmpl-1", [choice_body(req, 0, " there", "length")], use)
    assert body["id"] == "cmpl-1" and body["object"] == "text_completion"
    assert body["model"] == "m" and isinstance(body["created"], int)
    assert body["choices"] == [
        {"index": 0, "text": " there", "finish_reason": "length", "logprobs": None}
    ]
    assert body["usage"] == use


def test_chat_chunks_carry_deltas() -> None:
    req = request("chat")
    body = chunk_body(req, "chatcmpl-1", 1700000000, "Hel", None)
    assert body == {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "m",
        "choices": [
            {"index": 0, "delta": {"content": "Hel"}, "finish_reason": None, "logprobs": None}
        ],
    }
    last = chunk_body(req, "chatcmpl-1", 1700000000, None, "stop")
    assert last["choices"][0]["delta"] == {} and last["choices"][0]["finish_reason"] == "stop"
    empty = chunk_body(req, "chatcmpl-1", 1700000000, "", None)
    assert empty["choices"][0]["delta"] == {"content": ""}


def test_text_completion_chunks_carry_text() -> None:
    req = request("completion")
    body = chunk_body(req, "cmpl-1", 1700000000, "lo", None)
    assert body == {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1700000000,
        "model": "m",
        "choices": [{"index": 0, "text": "lo", "finish_reason": None, "logprobs": None}],
    }
    last = chunk_body(req, "cmpl-1", 1700000000, None, "length")
    assert last["choices"][0]["text"] == "" and last["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(
    ("endpoint", "obj"), [("chat", "chat.completion.chunk"), ("completion", "text_completion")]
)
def test_usage_chunk_is_an_sse_event_with_no_choices(endpoint: str, obj: str) -> None:
    use = usage(12, 4, 8)
    raw = usage_chunk(request(endpoint), "id-1", 1700000000, use)
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n")
    body = orjson.loads(raw[len(b"data: ") : -2])
    assert body == {
        "id": "id-1",
        "object": obj,
        "created": 1700000000,
        "model": "m",
        "choices": [],
        "usage": use,
    }
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 8}


def test_sse_frames_one_event() -> None:
    body = {"text": "line one\nline two", "n": 1}
    raw = sse(body)
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n")
    assert raw.count(b"\n") == 2  # a newline in the text is escaped, so the event is one line
    assert orjson.loads(raw[len(b"data: ") : -2]) == body


@pytest.mark.parametrize("value", [10.5, "10", True])
def test_max_tokens_must_be_a_whole_number(value: object) -> None:
    assert refused(chat(max_tokens=value)).param == "max_tokens"


@pytest.mark.parametrize("value", [False, 0, "", []])
def test_stream_options_must_be_an_object(value: object) -> None:
    assert refused(chat(stream=True, stream_options=value)).param == "stream_options"


def test_a_part_is_text_only_when_its_type_says_so() -> None:
    parts = [{"type": "image_url", "text": "sneaky", "image_url": {"url": "x"}}]
    assert refused(chat(messages=[{"role": "user", "content": parts}])).param == "messages"


# n, logprobs, and the fields the backend does not implement


def test_n_and_logprobs_are_read() -> None:
    req = parse_generation(chat(n=3, logprobs=True, top_logprobs=5), "chat")
    assert req.n == 3 and req.logprobs and req.sampling.logprobs == 5
    plain = parse_generation(chat(logprobs=True), "chat")
    assert plain.sampling.logprobs == 0  # the chosen token's logprob, no alternatives
    assert parse_generation(chat(logprobs=False), "chat").sampling.logprobs is None
    assert parse_generation(chat(n=8), "chat").n == 8


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"top_logprobs": 3}, "top_logprobs"),  # without logprobs: true
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 2.5}, "top_logprobs"),
        ({"logprobs": 1}, "logprobs"),
        ({"logprobs": "true"}, "logprobs"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"tools": []}, "tools"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"parallel_tool_calls": True}, "parallel_tool_calls"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {}}}, "response_format"),
        ({"frequency_penalty": 0.5}, "frequency_penalty"),
        ({"presence_penalty": False}, "presence_penalty"),  # False is not 0
        ({"logit_bias": {"50256": -100}}, "logit_bias"),
        ({"store": True}, "store"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"reasoning_effort": "low"}, "reasoning_effort"),
        ({"top_k": 40}, "top_k"),
        ({"cache_salt": "x"}, "cache_salt"),
        ({"best_of": 2}, "best_of"),
    ],
)
def test_what_the_chat_endpoint_does_not_implement_is_refused_naming_it(
    fields: dict[str, Any], param: str
) -> None:
    assert refused(chat(**fields), "chat").param == param


def test_the_refusal_of_an_unknown_field_names_it_in_the_message() -> None:
    error = refused(chat(frobnicate=1), "chat")
    assert error.param == "frobnicate" and "frobnicate" in error.message
    assert "tool calling" in refused(chat(tools=[{"type": "function"}])).message


@pytest.mark.parametrize(
    "fields",
    [
        {"response_format": {"type": "text"}},
        {"tools": None, "tool_choice": "none", "parallel_tool_calls": None},
        {"frequency_penalty": 0, "presence_penalty": 0.0, "logit_bias": {}},
        {"user": "end-user-7", "safety_identifier": "h1", "store": False},
        {"modalities": ["text"], "service_tier": "auto", "metadata": None},
    ],
)
def test_fields_that_ask_for_nothing_are_accepted(fields: dict[str, Any]) -> None:
    parse_generation(chat(**fields), "chat")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"logprobs": 6}, "logprobs"),
        ({"logprobs": True}, "logprobs"),
        ({"echo": True}, "echo"),
        ({"suffix": "end"}, "suffix"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"messages": MSG}, "messages"),
    ],
)
def test_what_the_completion_endpoint_does_not_implement_is_refused(
    fields: dict[str, Any], param: str
) -> None:
    assert refused(completion(**fields), "completion").param == param
    parse_generation(completion(echo=False, best_of=1), "completion")
    assert parse_generation(completion(logprobs=5), "completion").sampling.logprobs == 5
    assert parse_generation(completion(logprobs=0), "completion").sampling.logprobs == 0


@pytest.mark.parametrize(
    "message",
    [
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function"}]},
        {"role": "function", "name": "f", "content": "42"},
    ],
)
def test_a_history_with_a_tool_call_is_refused_saying_so(message: dict[str, Any]) -> None:
    error = refused(chat(messages=[*MSG, message]))
    assert error.param == "messages" and "tool call" in error.message


def test_each_choice_draws_from_its_own_seed_and_choice_0_from_the_requests() -> None:
    req = parse_generation(chat(n=3, seed=7, temperature=0.8), "chat")
    seeds = [req.choice_sampling(i).seed for i in range(3)]
    assert seeds[0] == 7 and len(set(seeds)) == 3
    assert seeds == [
        parse_generation(chat(n=3, seed=7), "chat").choice_sampling(i).seed for i in range(3)
    ]
    unseeded = parse_generation(chat(n=2), "chat")
    assert unseeded.choice_sampling(1) == unseeded.sampling


def test_choices_and_chunks_carry_their_index_and_logprobs() -> None:
    req = parse_generation(chat(n=2, logprobs=True), "chat")
    entry = {"token": "Hi", "logprob": -0.5, "bytes": [72, 105], "top_logprobs": []}
    shaped = {"content": [entry], "refusal": None}
    choice = choice_body(req, 1, "Hi", "stop", shaped)
    assert choice["index"] == 1 and choice["logprobs"] == shaped
    chunk = chunk_body(req, "c", 1, "Hi", None, 1, shaped)["choices"][0]
    assert chunk["index"] == 1 and chunk["logprobs"] == shaped
    assert chunk_body(req, "c", 1, None, "stop", 1)["choices"][0]["logprobs"] is None
