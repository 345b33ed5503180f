"""Starts a real vLLM OpenAI server from .venv-vllm (or, with `running_server`, any local server)
on a free loopback port and stops it again.

Invariant: the block is entered only after the health URL answered 200, and on exit no process
started for it is left running.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.kit.polling import until_sync

REPO_ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO_ROOT / ".venv-vllm" / "bin" / "python"
MODEL_DIR = REPO_ROOT / ".models" / "smollm2-hf"
SERVED_MODEL = "smollm2"
# /proc/cpuinfo flags of bfloat16 matrix instructions (x86: AVX512-BF16, AMX; Arm: BF16).
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def host_dtype(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """bfloat16 where the CPU multiplies it natively, float32 elsewhere: vLLM's CPU build
    emulates bfloat16 on AVX2, and a request then takes about 2.6x as long (a 360-token prompt
    and 16 tokens out: 3.2 s against 1.2 s on a 2-core AVX2 host)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return "float32"
    flags = {f for line in text.splitlines() if line.startswith(("flags", "Features"))
             for f in line.partition(":")[2].split()}  # fmt: skip
    return "bfloat16" if flags & BF16_FLAGS else "float32"


class ServerStartError(RuntimeError):
    """The server exited or did not become healthy before the deadline; the message has its log."""


@dataclass(frozen=True, slots=True)
class VllmConfig:
    python: Path = VLLM_PYTHON
    model_dir: Path = MODEL_DIR
    served_model: str = SERVED_MODEL
    kv_cache_gib: int = 2
    # 256 blocks of 128 tokens: small enough that the tests see evictions within minutes.
    kv_blocks: int | None = 256
    max_model_len: int = 4096
    dtype: str = field(default_factory=host_dtype)
    # A loaded 2-core host (the suite, the fresh tier and compose builds beside it) can take
    # several minutes to start vLLM; a start that fails is retried once (running_vllm).
    ready_timeout_s: float = 600.0
    extra_args: tuple[str, ...] = field(default_factory=tuple)


# scripts/test builds the vLLM environment beside the suite and names here the file its exit
# code will be written to: what needs the environment or its model directory waits for it.
BUILDING = "KVFENCE_VLLM_BUILDING"


def await_build(timeout_s: float = 1800.0) -> None:
    """Wait for the vLLM build that scripts/test runs beside the suite, if one is under way (a
    test that needs it comes minutes into the suite, so it rarely waits). A build that ended
    with 0 makes the vLLM tests required (KVFENCE_REQUIRE_VLLM=1); one that failed leaves them
    skipped, as scripts/test says at its end."""
    done = os.environ.get(BUILDING)
    if not done:
        return
    path = Path(done)
    deadline = time.monotonic() + timeout_s
    while not path.is_file():
        if time.monotonic() > deadline:
            raise ServerStartError(f"the vLLM build beside the suite did not end in {timeout_s} s")
        time.sleep(1.0)
    if path.read_text().strip() == "0":
        os.environ["KVFENCE_REQUIRE_VLLM"] = "1"
    del os.environ[BUILDING]


def missing_reason(config: VllmConfig | None = None) -> str | None:
    """Why vLLM cannot be started here, or None when its environment and model are present
    (once the build beside the suite, if any, has ended)."""
    await_build()
    cfg = config or VllmConfig()
    if not cfg.python.is_file():
        return f"{cfg.python} not found: run scripts/vllm-env"
    if not (cfg.model_dir / "config.json").is_file():
        return f"{cfg.model_dir}/config.json not found: run scripts/vllm-env"
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def vllm_command(cfg: VllmConfig, port: int) -> list[str]:
    return [
        str(cfg.python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(cfg.model_dir),
        "--served-model-name",
        cfg.served_model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--enforce-eager",
        "--dtype",
        cfg.dtype,
        "--max-model-len",
        str(cfg.max_model_len),
        *(("--num-gpu-blocks-override", str(cfg.kv_blocks)) if cfg.kv_blocks else ()),
        *cfg.extra_args,
    ]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def _wait_healthy(proc: subprocess.Popen[bytes], health_url: str, timeout_s: float) -> None:
    def ready() -> bool:
        if _healthy(health_url):
            return True
        # Waiting on the process doubles as the poll interval and notices an early exit at once.
        with contextlib.suppress(subprocess.TimeoutExpired):
            code = proc.wait(timeout=0.5)
            raise ServerStartError(f"the server exited with status {code} before becoming healthy")
        return False

    if not until_sync(ready, timeout_s, interval_s=0):
        raise ServerStartError(f"{health_url} did not answer 200 before the deadline")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Terminate the server's process group (vLLM: API server and engine core), then reap it."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    # Children that outlived the leader still belong to its group.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def _log_tail(log: Path, limit: int = 4000) -> str:
    return log.read_text(errors="replace")[-limit:]


@contextlib.contextmanager
def running_server(
    command: list[str], health_url: str, env: dict[str, str], ready_timeout_s: float
) -> Iterator[None]:
    """Run `command` in its own process group until the block ends; enter once health is 200."""
    with tempfile.TemporaryDirectory(prefix="kvfence-server-") as tmp:
        log = Path(tmp) / "server.log"
        with log.open("wb") as sink:
            proc = subprocess.Popen(
                command,
                stdout=sink,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=tmp,
                start_new_session=True,
            )
        try:
            try:
                _wait_healthy(proc, health_url, ready_timeout_s)
            except ServerStartError as exc:
                tail = _log_tail(log)
                raise ServerStartError(f"{exc}\n--- server log tail ---\n{tail}") from None
            yield
        finally:
            _stop(proc)


@contextlib.contextmanager
def running_vllm(config: VllmConfig | None = None) -> Iterator[str]:
    """Run vLLM for the duration of the block; yields its base URL (http://127.0.0.1:PORT)."""
    cfg = config or VllmConfig()
    reason = missing_reason(cfg)
    if reason is not None:
        raise ServerStartError(reason)
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=str(cfg.kv_cache_gib))
    with contextlib.ExitStack() as stack:
        for attempt in (1, 2):
            port = free_port()
            base_url = f"http://127.0.0.1:{port}"
            command, health = vllm_command(cfg, port), f"{base_url}/health"
            try:
                stack.enter_context(running_server(command, health, env, cfg.ready_timeout_s))
                break
            except ServerStartError as exc:
                if attempt == 2:
                    raise
                first = str(exc).splitlines()[0] if str(exc) else "ServerStartError"
                print(f"vLLM did not start ({first}); starting it once more", file=sys.stderr)
        yield base_url
