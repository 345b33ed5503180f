"""A gateway whose admin listener has no token refuses registry actions (403): the command says
so in one line and names the other way, changing the registry file with `--offline`."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from gateway.policy.load import load_policy
from gateway.policy.registry import RegistryError
from gateway.registry.client import Target

REFUSAL = (b'{"error":{"message":"set gateway.admin.token to allow actions",'
           b'"type":"permission_error","code":"admin_token_required"}}')  # fmt: skip


class _Refuses(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.send_response(403)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(REFUSAL)))
        self.end_headers()
        self.wfile.write(REFUSAL)

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def refusing() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _Refuses)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def test_a_refused_action_names_offline(tmp_path: Path, refusing: str) -> None:
    (tmp_path / "ns").write_text("n" * 44)
    (tmp_path / "pepper").write_text("p" * 44)
    for name in ("ns", "pepper"):
        (tmp_path / name).chmod(0o600)
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "version: 1\ngateway:\n  state_dir: state\n"
        "  namespace_keys: [{id: ns1, secret: {file: ns}, active: true}]\n"
        "  api_key_pepper: {file: pepper}\n"
        "backends:\n  - {name: v, kind: vllm, url: 'http://127.0.0.1:9', verify: {canary: false},"
        " models: [{name: m, revision: '1'}]}\nregistry: true\ntenants: []\n"
    )
    target = Target(load_policy(policy), refusing, None)
    with pytest.raises(RegistryError) as refused:
        target.call("POST", "/keys/key_000000000000/revoke")
    assert str(refused.value) == (
        "403: set gateway.admin.token to allow actions "
        "(or change the registry file itself: add --offline)"
    )
