"""A fleet on loopback, as processes: our backends (`kvfence backend`, the real SmolLM2, small KV
pools), gateway replicas (`kvfence gateway`) sharing one real redis-server, and what their
admin listeners say. Used by tests/e2e/test_fleet.py and bench/fleet_routing.py."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kvfence.keys.apikey import key_digest
from tests.kit.polling import until_sync
from tests.kit.redis_server import free_port
from tests.kit.stack import PEPPER, Keys

_REQUESTS = re.compile(r"^kvfence_gateway_requests_total\{([^}]*)\} (\S+)$", re.M)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def _get(url: str, timeout: float = 2.0) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return bytes(resp.read()) if resp.status == 200 else None
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


@dataclass
class Backend:
    name: str
    port: int
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None  # its stdout and stderr

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_backend(backend: Backend, keys: Keys, blocks: int = 96, threads: int = 1) -> None:
    # -X faulthandler: a backend that never becomes ready prints its stacks on SIGABRT.
    command = [sys.executable, "-X", "faulthandler", "-m", "kvfence.cli", "backend",
               "--model", "smollm2",
               "--id", backend.name, "--trust", str(keys.folder / "backend-trust.json"),
               "--signing-key", str(keys.folder / "be.key"), "--port", str(backend.port),
               "--kv-blocks", str(blocks), "--device", "cpu", "--threads", str(threads),
               "--log-level", "warning"]  # fmt: skip
    backend.log = keys.folder / f"{backend.name}.log"
    with backend.log.open("ab") as log:
        backend.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)


def wait_ready(backends: list[Backend], timeout_s: float = 420) -> None:
    """Until every backend answers /readyz. Each probes its kernels and loads the model first:
    about 10 s on a quiet 2-core host, minutes when CI's other tiers install and build beside
    the suite. Past `timeout_s` the failure says, for each backend not ready, its CPU time, its
    state and what it was doing (its Python stacks, from faulthandler)."""

    def ready() -> bool:
        for b in backends:
            assert b.proc is not None and b.proc.poll() is None, (
                f"backend {b.name} exited:\n{_tail(b)}"
            )
        return all(_get(b.url + "/readyz") is not None for b in backends)

    if until_sync(ready, timeout_s, 0.5):
        return
    waiting = [b for b in backends if _get(b.url + "/readyz") is None]
    found = "\n".join(_stuck(b) for b in waiting)
    raise AssertionError(f"backends not ready within {timeout_s:g} s:\n{found}")


def _stuck(backend: Backend) -> str:
    """What a backend that is not ready is doing: CPU time, state, kernel wait, Python stacks."""
    assert backend.proc is not None
    pid = backend.proc.pid
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu_s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        wchan = Path(f"/proc/{pid}/wchan").read_text() or "-"
        said = f"state {fields[0]}, {cpu_s:.1f} s of CPU, kernel wait {wchan}"
    except (OSError, IndexError, ValueError) as exc:
        said = f"no /proc entry ({exc})"
    backend.proc.send_signal(signal.SIGABRT)  # faulthandler writes every thread's stack
    with contextlib.suppress(subprocess.TimeoutExpired):
        backend.proc.wait(timeout=10)
    return f"backend {backend.name} (pid {pid}): {said}\n{_tail(backend)}"


def _tail(backend: Backend, limit: int = 6000) -> str:
    if backend.log is None or not backend.log.exists():
        return "(no log)"
    return backend.log.read_text(errors="replace")[-limit:] or "(its log is empty)"


@dataclass
class GatewayReplica:
    port: int
    admin_port: int
    policy: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def status(self) -> dict[str, object]:
        raw = _get(self.admin + "/status")
        assert raw is not None, "the admin listener did not answer /status"
        found: dict[str, object] = json.loads(raw)
        return found

    def served(self, tenant: str) -> Counter[str]:
        """Answers with status 200 to `tenant`, by backend."""
        raw = _get(self.admin + "/metrics") or b""
        out: Counter[str] = Counter()
        for labels, value in _REQUESTS.findall(raw.decode()):
            found = dict(_LABEL.findall(labels))
            if found.get("tenant") == tenant and found.get("status") == "200":
                out[found["backend"]] += int(float(value))
        return out


def fleet_policy(
    keys: Keys,
    replica: GatewayReplica,
    backends: list[Backend],
    redis_url: str,
    *,
    on_failure: str = "closed",
    strategy: str = "affinity",
    tenants: str = "",
) -> Path:
    digests = {t: key_digest(PEPPER.encode(), k) for t, k in keys.api_keys.items()}
    listed = "".join(
        f"""
          - name: {b.name}
            kind: kvfence
            url: {b.url}
            audience: {b.name}
            attestation_keys: {{file: gateway-trust.json}}
            models: [{{name: smollm2, revision: "1"}}]"""
        for b in backends
    )
    text = textwrap.dedent(f"""\
        version: 1
        gateway:
          listen: {{host: 127.0.0.1, port: {replica.port}}}
          admin: {{host: 127.0.0.1, port: {replica.admin_port}}}
          namespace_keys: [{{id: ns1, secret: {{file: ns.key}}, active: true}}]
          api_key_pepper: {{file: pepper}}
          handle_key: {{id: gateway, private_key: {{file: gateway.key}}}}
          audit_log: {{path: audit-{replica.port}.jsonl, key: {{file: audit.key}}, fsync: batch}}
          timeouts: {{connect_s: 2, first_byte_s: 120, idle_s: 60}}
          access_log: false
          routing: {{strategy: {strategy}, retries: 1, eject_after_errors: 2, eject_for_s: 60}}
          shared: {{redis: {{url: '{redis_url}', timeout_s: 0.3}}, on_failure: {on_failure}}}
        backends:{listed}
        tenants:
          - {{id: acme, api_keys: ["{digests["acme"]}"], scope: user, models: [smollm2]}}
          - {{id: globex, api_keys: ["{digests["globex"]}"], scope: tenant, models: [smollm2],
              {tenants or "limits: {requests_per_s: 0.01, burst: 2}"}}}
        """)
    replica.policy.write_text(text)
    return replica.policy


def new_replica(folder: Path) -> GatewayReplica:
    port = free_port()
    return GatewayReplica(port, free_port(), folder / f"gateway-{port}.yaml")


@contextlib.contextmanager
def gateway_replicas(replicas: list[GatewayReplica]) -> Iterator[list[GatewayReplica]]:
    from tests.kit.gateway_process import gateway_process

    with contextlib.ExitStack() as stack:
        for replica in replicas:
            replica.proc = stack.enter_context(
                gateway_process(replica.policy, replica.url, workers=1)
            )
        yield replicas
