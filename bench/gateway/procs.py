"""The benchmark's server processes: the fake upstream and a real `kvfence gateway`, each pinned
to one core, plus CPU-time probes read from /proc.

Invariant: every process started here is stopped (SIGTERM, then SIGKILL) when its context exits.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvfence.keys.apikey import key_digest, mint_key

_TICK = os.sysconf("SC_CLK_TCK")
MODEL = "smollm2"


@dataclass(frozen=True, slots=True)
class Server:
    pid: int
    port: int
    ready_s: float = 0.0  # from the process's start to its first healthy answer (gateways)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (clock-tick resolution)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime: fields 14 and 15


def cpu_split(pid: int) -> tuple[float, float]:
    """User and system CPU time of a process so far (clock-tick resolution)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return int(fields[11]) / _TICK, int(fields[12]) / _TICK


def tree_cpu_split(pid: int) -> tuple[float, float]:
    """User and system CPU time of a process and its live children (a gateway's workers)."""
    user, system = cpu_split(pid)
    with contextlib.suppress(FileNotFoundError):
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            with contextlib.suppress(FileNotFoundError):
                more = cpu_split(int(child))
                user, system = user + more[0], system + more[1]
    return user, system


def runqueue_wait_seconds(pid: int) -> float:
    """Time the process's main thread has spent runnable but waiting for a core (schedstat)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9


def peak_rss_mib(pid: int) -> float:
    """Peak resident memory (VmHWM) of a process and its live children, summed, in MiB."""

    def hwm(one: int) -> int:
        for line in Path(f"/proc/{one}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
        return 0

    total = hwm(pid)
    with contextlib.suppress(FileNotFoundError):
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            with contextlib.suppress(FileNotFoundError):
                total += hwm(int(child))
    return total / 1024


def fsync_latency(folder: Path, count: int = 200) -> dict[str, float]:
    """The disk's sync latency where the audit log lives: `count` times a 4 KiB write to one
    file and its fsync, in milliseconds."""
    times: list[float] = []
    with tempfile.NamedTemporaryFile(dir=folder, prefix=".fsync-probe-") as probe:
        block = os.urandom(4096)
        for _ in range(count):
            os.write(probe.fileno(), block)
            start = time.perf_counter()
            os.fsync(probe.fileno())
            times.append((time.perf_counter() - start) * 1e3)
    times.sort()
    return {
        "count": count,
        "p50_ms": times[len(times) // 2],
        "p99_ms": times[min(len(times) - 1, int(len(times) * 0.99))],
        "mean_ms": sum(times) / len(times),
    }


def core_busy_seconds(core: int) -> float:
    """Non-idle time of one CPU core so far, whoever used it (from /proc/stat)."""
    with open("/proc/stat") as stat:
        for line in stat:
            if line.startswith(f"cpu{core} "):
                ticks = [int(x) for x in line.split()[1:]]
                return (sum(ticks[:8]) - ticks[3] - ticks[4]) / _TICK  # minus idle, iowait
    raise ValueError(f"no cpu{core} in /proc/stat")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def place(core: int | None, nice: int, own_session: bool = False) -> None:
    """Pin the calling process to `core` (None: any) and set its nice value (negative needs
    privilege). With `own_session` (a child about to exec), also a session of its own whose
    autogroup gets that nice: Linux weighs autogroups (one per session) against each other
    first, so without it nice only ranks the harness's own processes among themselves."""
    if core is not None:
        os.sched_setaffinity(0, {core})
    if nice:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    if nice and own_session:
        os.setsid()
        with contextlib.suppress(OSError):  # a kernel without autogroups: nice alone it is
            Path("/proc/self/autogroup").write_text(str(nice))


def placement(core: int | None, nice: int) -> Callable[[], None]:
    """A `preexec_fn` that places a child (see `place`)."""
    return functools.partial(place, core, nice, True)


def _popen(
    cmd: list[str],
    where: tuple[int | None, int],
    env: dict[str, str] | None = None,
    *,
    pipe: bool = False,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE if pipe else subprocess.DEVNULL,
        env=env,
        cwd=cwd or Path(__file__).resolve().parents[2],
        preexec_fn=placement(*where),
    )


def commit_of(root: Path, rev: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), "rev-parse", rev], capture_output=True, text=True, check=False
    ).stdout.strip()


def source_state(root: Path) -> dict[str, str]:
    """The commit benchmarked and whether the gateway's code differs from it in the tree."""
    head = commit_of(root, "HEAD")
    dirty = subprocess.run(
        ["git", "-C", str(root), "status", "--porcelain", "--", "gateway", "kvfence"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return {"commit": head, "gateway_tree": "modified" if dirty else "clean"}


@contextlib.contextmanager
def exported(root: Path, rev: str) -> Iterator[Path]:
    """`kvfence/` and `gateway/` as of `rev`, in a temporary folder."""
    with tempfile.TemporaryDirectory(prefix="kvfence-rev-") as tmp:
        archive = subprocess.run(
            ["git", "-C", str(root), "archive", rev, "kvfence", "gateway"],
            capture_output=True,
            check=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        yield Path(tmp)


@contextlib.contextmanager
def _announcing(cmd: list[str], where: tuple[int | None, int], what: str) -> Iterator[Server]:
    """A server that prints `PORT <n>` once listening."""
    proc = _popen(cmd, where, pipe=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        if not line.startswith("PORT "):
            raise RuntimeError(f"{what} did not start: {line!r}")
        yield Server(proc.pid, int(line.split()[1]))
    finally:
        stop(proc)


def upstream(core: int, nice: int = 0) -> contextlib.AbstractContextManager[Server]:
    """The fake upstream (bench.gateway.upstream) on `core`."""
    cmd = [sys.executable, "-m", "bench.gateway.upstream", "--port", "0"]
    return _announcing(cmd, (core, nice), "the fake upstream")


def paced_upstream(
    core: int, tokens: int, gap_ms: float, nice: int = 0
) -> contextlib.AbstractContextManager[Server]:
    """The token-paced fake upstream (bench.gateway.paced_upstream) on `core`."""
    cmd = [sys.executable, "-m", "bench.gateway.paced_upstream", "--port", "0"]
    cmd += ["--tokens", str(tokens), "--gap-ms", f"{gap_ms:g}"]
    return _announcing(cmd, (core, nice), "the paced upstream")


def floor(url: str, core: int | None, nice: int = 0) -> contextlib.AbstractContextManager[Server]:
    """The bare aiohttp relay (bench.gateway.floor) in front of `url`, on `core`."""
    cmd = [sys.executable, "-m", "bench.gateway.floor", "--upstream", url]
    return _announcing(cmd, (core, nice), "the aiohttp floor")


def _policy_text(
    upstreams: Mapping[str, int], digest: str, gateway_lines: str = "", tenant_lines: str = ""
) -> str:
    """One `vllm`-kind backend per model (the first is `fake`, as the overhead bench names it)."""
    backends = "".join(
        f"""  - name: {"fake" if i == 0 else f"fake-{model}"}
    kind: vllm
    url: http://127.0.0.1:{port}
    verify: {{canary: false}}  # the fake has no cache; the detective and marker scan stay on
    models: [{{name: {model}, revision: "1"}}]
"""
        for i, (model, port) in enumerate(upstreams.items())
    )
    return f"""version: 1
gateway:
  listen: {{host: 127.0.0.1, port: 8080}}
  namespace_keys:
    - {{id: bench, secret: {{env: KVFENCE_BENCH_NS_KEY}}, active: true}}
  api_key_pepper: {{env: KVFENCE_BENCH_PEPPER}}
  limits: {{max_connections: 8192, max_body_bytes: 4194304}}
  admin: {{port: 0}}
  access_log: false
{gateway_lines}backends:
{backends}tenants:
  - id: bench
    api_keys: ["{digest}"]
    scope: tenant
    models: [{", ".join(upstreams)}]
{tenant_lines}"""


def _wait_ready(port: int, proc: subprocess.Popen[bytes], deadline_s: float) -> float:
    """Seconds from now until the gateway answers /healthz."""
    start = time.monotonic()
    deadline = start + deadline_s
    url = f"http://127.0.0.1:{port}/healthz"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the gateway exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as answer:
                if answer.status == 200:
                    return time.monotonic() - start
        except OSError:  # refused, reset, timed out: not up yet
            time.sleep(0.05)
    raise RuntimeError(f"the gateway was not ready within {deadline_s} s")


@contextlib.contextmanager
def gateway(
    upstream_port: int,
    core: int | None,
    nice: int = 0,
    source: Path | None = None,
    *,
    models: Mapping[str, int] | None = None,
    workers: int = 1,
    gateway_lines: str = "",
    tenant_lines: str = "",
    env_extra: Mapping[str, str] | None = None,
    wrapper: Sequence[str] = (),
) -> Iterator[tuple[Server, str]]:
    """`kvfence gateway --workers N` in front of the upstream, with throwaway secrets; yields the
    server and a tenant API key. With `source`, the gateway's code is imported from there;
    `models` maps each model to its own upstream port (default: MODEL on `upstream_port`);
    `gateway_lines` are added to the policy's `gateway:` section (with `env_extra` for their
    secrets; relative paths are in a temporary folder), `tenant_lines` to the tenant's entry;
    `wrapper` is a `python -m` module that runs the gateway's command line itself."""
    pepper = secrets.token_urlsafe(24)
    key = mint_key()
    env = dict(os.environ)
    env["KVFENCE_BENCH_NS_KEY"] = secrets.token_urlsafe(48)
    env["KVFENCE_BENCH_PEPPER"] = pepper
    env.update(env_extra or {})
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="kvfence-bench-") as tmp:
        policy = Path(tmp) / "policy.yaml"
        upstreams = models if models is not None else {MODEL: upstream_port}
        digest = key_digest(pepper.encode(), key)
        policy.write_text(_policy_text(upstreams, digest, gateway_lines, tenant_lines))
        cmd = [sys.executable, *wrapper, "-m", "kvfence.cli", "gateway", "--policy", str(policy)]
        cmd += ["--workers", str(workers)]
        # `python -m` puts the working folder first on sys.path: run from `source` to import it.
        cmd += ["--port", str(port), "--log-level", "warning"]
        proc = _popen(cmd, (core, nice), env, cwd=source)
        try:
            ready_s = _wait_ready(port, proc, deadline_s=60)
            yield Server(proc.pid, port, ready_s), key
        finally:
            stop(proc)
