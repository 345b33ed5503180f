"""Probes shared by the hardening tests and bench/hardening.py (which also runs them against an
older checkout): raw requests the edge must refuse, body fields no backend may get, and policy
file contents the watcher must survive. Nothing here imports code newer than the shape commit.
"""

from __future__ import annotations

from typing import Any

from tests.kit.gateway import KEYS

KEY = KEYS["acme"].encode()
INNER = b'{"model":"smollm2","messages":[{"role":"user","content":"smuggled"}]}'


def post(version: bytes = b"HTTP/1.1", extra: bytes = b"", body: bytes = INNER) -> bytes:
    """An authenticated chat request: what a smuggler hides behind the refused one."""
    return (
        b"POST /v1/chat/completions " + version + b"\r\nHost: gw\r\n"
        b"Authorization: Bearer " + KEY + b"\r\n" + extra + b"Content-Length: "
        + str(len(body)).encode() + b"\r\n\r\n" + body
    )  # fmt: skip


SMUGGLED = post()
CHUNKED = hex(len(INNER))[2:].encode() + b"\r\n" + INNER + b"\r\n0\r\n\r\n"
AUTH = b"Authorization: Bearer " + KEY + b"\r\n"


def connect(key: bytes = b"") -> bytes:
    return (
        b"CONNECT upstream:443 HTTP/1.1\r\nHost: upstream:443\r\n" + key
        + b"Content-Length: " + str(len(SMUGGLED)).encode() + b"\r\n\r\n" + SMUGGLED
    )  # fmt: skip


def head(line: bytes, headers: bytes = b"Host: gw\r\n" + AUTH, body: bytes = b"") -> bytes:
    return line + b"\r\n" + headers + b"\r\n" + body


# (name, request bytes, the status the gateway answers with). Every request is followed on
# the same connection by an authenticated, valid chat request that must never be forwarded.
REFUSED: list[tuple[str, bytes, int]] = [
    # finding 1 as measured
    ("connect_without_key", connect(), 405),
    ("connect_with_key", connect(AUTH), 405),
    ("http10_chunked", post(b"HTTP/1.0", b"Transfer-Encoding: chunked\r\n", b"")[:-2]
     .replace(b"Content-Length: 0\r\n", b"") + b"\r\n" + CHUNKED, 400),
    ("http20_request_line", post(b"HTTP/2.0"), 505),
    ("host_with_space", post().replace(b"Host: gw", b"Host: a b"), 400),
    ("host_with_userinfo", post().replace(b"Host: gw", b"Host: user:pass@host"), 400),
    # the same class, further variants
    ("http09_request_line", post(b"HTTP/0.9"), 505),
    ("no_version", b"GET /healthz\r\n\r\n", 505),
    ("host_with_path", post().replace(b"Host: gw", b"Host: gw/admin"), 400),
    ("host_with_tab", post().replace(b"Host: gw", b"Host: gw\tx"), 400),
    ("host_empty", post().replace(b"Host: gw", b"Host:"), 400),
    ("host_missing_1_1", post().replace(b"Host: gw\r\n", b""), 400),
    ("host_twice", post().replace(b"Host: gw", b"Host: gw\r\nHost: other"), 400),
    ("absolute_form", post().replace(b"POST /v1", b"POST http://other/v1"), 400),
    ("asterisk_form", head(b"OPTIONS * HTTP/1.1"), 405),
    ("double_slash_target", post().replace(b"POST /v1", b"POST //other/v1"), 400),
    ("te_gzip_chunked", head(b"POST /v1/chat/completions HTTP/1.1",
                             b"Host: gw\r\n" + AUTH + b"Transfer-Encoding: gzip, chunked\r\n",
                             CHUNKED), 400),
    ("te_twice", head(b"POST /v1/chat/completions HTTP/1.1",
                      b"Host: gw\r\n" + AUTH + b"Transfer-Encoding: chunked\r\n"
                      b"Transfer-Encoding: chunked\r\n", CHUNKED), 400),
    ("upgrade_websocket", head(b"GET /healthz HTTP/1.1",
                               b"Host: gw\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                               b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                               b"Sec-WebSocket-Version: 13\r\n"), 400),
    ("upgrade_h2c", head(b"GET /healthz HTTP/1.1",
                         b"Host: gw\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
                         b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n"), 400),
    *[(f"method_{m.decode().lower()}", post().replace(b"POST", m, 1), 405)
      for m in (b"PUT", b"DELETE", b"PATCH", b"OPTIONS", b"TRACE", b"HEAD", b"PROPFIND")],
    # framing ambiguities aiohttp's parser refused before this change: kept refused
    ("content_length_and_chunked", post(extra=b"Transfer-Encoding: chunked\r\n"), 400),
    ("duplicate_content_length", post(extra=b"Content-Length: 5\r\n"), 400),
    ("bad_chunk_size", head(b"POST /v1/chat/completions HTTP/1.1",
                            b"Host: gw\r\n" + AUTH + b"Transfer-Encoding: chunked\r\n",
                            b"zz\r\n" + INNER + b"\r\n0\r\n\r\n"), 400),
    ("chunk_longer_than_said", head(b"POST /v1/chat/completions HTTP/1.1",
                                    b"Host: gw\r\n" + AUTH + b"Transfer-Encoding: chunked\r\n",
                                    b"5\r\n" + INNER + b"\r\n0\r\n\r\n"), 400),
    ("obs_fold", post(extra=b"X-Note: a\r\n folded\r\n"), 400),
    ("nul_in_header", post(extra=b"X-Note: a\x00b\r\n"), 400),
    ("lf_only_lines", post().replace(b"\r\n", b"\n"), 400),
    ("lowercase_method", post().replace(b"POST", b"post", 1), 400),
]  # fmt: skip

# Finding 2 as measured: each of these was forwarded verbatim.
FORWARDED_BEFORE: dict[str, Any] = {
    "kv_transfer_params": {"do_remote_prefill": True, "remote_block_ids": [1, 2, 3],
                           "remote_engine_id": "victim-engine", "remote_host": "10.0.0.9"},
    "bootstrap_host": "10.0.0.9",
    "bootstrap_port": 8998,
    "bootstrap_room": 42,
    "rid": "victim-request",
    "session_params": {"id": "victim-session", "rid": "r"},
    "disaggregated_params": {"request_type": "generation_only", "ctx_request_id": 7},
    "nvext": {"backend_instance_id": 3, "worker_id": 3, "session_control": {"id": "s"}},
    "request_id": "victim-request",
    "previous_response_id": "resp_victim",
    "priority": -100,
    "session_id": "victim-session",
    "ec_transfer_params": {"remote_host": "10.0.0.9"},
    "data_parallel_rank": 0,
}  # fmt: skip
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA", "uuid": "v-img"},
         "uuid": "victim-image", "content_hash": "victim-hash"}  # fmt: skip
OPENAI_KEPT = {"temperature": 0.5, "max_tokens": 7, "stop": ["x"], "seed": 3, "user": "u-1",
               "response_format": {"type": "json_object"}, "logit_bias": {"5": -100}}  # fmt: skip


def chat_body(**extra: Any) -> dict[str, Any]:
    message = {"role": "user", "uuid": "victim-message",
               "content": [{"type": "text", "text": "hi", "uuid": "t"}, IMAGE]}  # fmt: skip
    return {"model": "smollm2", "messages": [message], **OPENAI_KEPT, **extra}


BAD_POLICY_CONTENT: dict[str, bytes] = {
    "invalid_utf8": b"version: 1\ngateway: \xff\xfe\n",
    "nested_5000_deep": b"version: 1\ngateway: " + b"[" * 5000 + b"]" * 5000 + b"\n",
    "nested_mappings": b"a:\n" + b"".join(b" " * i + b"b:\n" for i in range(1, 3000)),
    "alias_bomb": b'a: &a ["x","x","x","x"]\nb: &b [*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b]\n'
    b"d: &d [*c,*c,*c,*c]\ne: [*d,*d,*d,*d]\n",
    "binary": bytes(range(256)) * 4,
    "nul_bytes": b"version: 1\x00\x00\n",
    "empty": b"",
    "only_a_comment": b"# nothing here\n",
    "a_list": b"- 1\n- 2\n",
    "a_huge_scalar": b"version: " + b"9" * 100_000 + b"\n",
    "tab_indented": b"version: 1\ngateway:\n\tlisten: {}\n",
    "unknown_tag": b"version: !!python/object:os.system 1\n",
}
