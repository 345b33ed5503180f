"""A static OpenAI-compatible upstream and a plain reverse proxy in front of it, both served by
one unprivileged nginx from a temporary prefix: the side-by-side benchmark's reference hops.

Invariant: the nginx started here is stopped (SIGQUIT, then SIGKILL) when its context exits,
and it writes nothing outside its temporary prefix.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.gateway.procs import placement
from bench.gateway.upstream import COMPLETION, RESPONSE_BODY, STREAM_USAGE

_HEAD_END = b"\r\n\r\n"


@dataclass(frozen=True, slots=True)
class Nginx:
    """Ports: the static upstream's JSON and SSE answers, and the proxy in front of each."""

    pid: int
    json_port: int
    sse_port: int
    proxy_json_port: int
    proxy_sse_port: int


def _body(answer: bytes) -> bytes:
    return answer.partition(_HEAD_END)[2]


def _sse_body() -> bytes:
    """The fake upstream's chunked SSE stream as one plain body (nginx sends it with a length)."""
    out = b""
    for chunk in STREAM_USAGE[1:]:
        while chunk:
            size, _, rest = chunk.partition(b"\r\n")
            n = int(size, 16)
            out += rest[:n]
            chunk = rest[n + 2 :]
    return out


def _literal(data: bytes) -> str:
    """An nginx string literal (single quotes; the bodies hold no quote or backslash)."""
    text = data.decode()
    if "'" in text or "\\" in text:
        raise ValueError("the static answer cannot be written as an nginx literal")
    return "'" + text + "'"


def _static(port: int, content_type: str, body: bytes, responses: bytes = b"") -> str:
    extra = (
        f"""
        location = /v1/responses {{
            default_type application/json;
            return 200 {_literal(responses)};
        }}"""
        if responses
        else ""
    )
    return f"""
    server {{
        listen 127.0.0.1:{port} backlog=1024;
        keepalive_requests 1000000;
        location / {{
            default_type {content_type};
            return 200 {_literal(body)};
        }}{extra}
    }}"""


def _proxy(port: int, upstream: str) -> str:
    return f"""
    server {{
        listen 127.0.0.1:{port} backlog=1024;
        keepalive_requests 1000000;
        location / {{
            proxy_pass http://{upstream};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}"""


def config(prefix: Path, ports: tuple[int, int, int, int], user: str | None) -> str:
    json_port, sse_port, proxy_json, proxy_sse = ports
    temps = "\n".join(
        f"    {name}_temp_path {prefix / name};"
        for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    return f"""{f"user {user};" if user else ""}
worker_processes 1;
daemon off;
pid {prefix / "nginx.pid"};
error_log {prefix / "error.log"} warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
{temps}
    upstream json {{ server 127.0.0.1:{json_port}; keepalive 64; }}
    upstream sse {{ server 127.0.0.1:{sse_port}; keepalive 64; }}
{_static(json_port, "application/json", _body(COMPLETION), RESPONSE_BODY)}
{_static(sse_port, "text/event-stream", _sse_body())}
{_proxy(proxy_json, "json")}
{_proxy(proxy_sse, "sse")}
}}
"""


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for sock in socks:
            sock.close()


def _wait_listening(ports: list[int], proc: subprocess.Popen[bytes], deadline_s: float) -> None:
    deadline = time.monotonic() + deadline_s
    waiting = list(ports)
    while waiting and time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"nginx exited with status {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", waiting[0]), timeout=1):
                waiting.pop(0)
        except OSError:
            time.sleep(0.05)
    if waiting:
        raise RuntimeError(f"nginx was not listening on {waiting} within {deadline_s} s")


@contextlib.contextmanager
def serve(binary: str, core: int | None, nice: int = 0) -> Iterator[Nginx]:
    """nginx (one worker, pinned to `core` when given, at niceness `nice`) serving the four
    ports."""
    with tempfile.TemporaryDirectory(prefix="kvfence-nginx-") as tmp:
        prefix = Path(tmp)
        prefix.chmod(0o755)  # a worker that drops to `nobody` still reads its prefix
        ports = _free_ports(4)
        root = "root" if os.geteuid() == 0 else None  # else nginx keeps the caller's user
        conf = prefix / "nginx.conf"
        conf.write_text(config(prefix, (ports[0], ports[1], ports[2], ports[3]), root))
        cmd = [binary, "-p", str(prefix), "-c", str(conf), "-e", str(prefix / "error.log")]
        place = placement(core, nice)
        proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=place
        )
        try:
            _wait_listening(ports, proc, deadline_s=10)
            yield Nginx(proc.pid, *ports)
        finally:
            if proc.poll() is None:
                proc.send_signal(3)  # SIGQUIT: graceful stop of master and worker
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
