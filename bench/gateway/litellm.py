"""LiteLLM's proxy as a peer hop of the side-by-side benchmark: one worker, one OpenAI-compatible
model per static nginx port, a throwaway master key as the tenant's key.

Invariant: the proxy started here is stopped (SIGTERM, then SIGKILL) when its context exits.
"""

from __future__ import annotations

import contextlib
import secrets
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path

from bench.gateway import procs


def _config(models: Mapping[str, int], master_key: str) -> str:
    entries = "".join(
        f"""  - model_name: {model}
    litellm_params:
      model: openai/{model}
      api_base: http://127.0.0.1:{port}/v1
      api_key: unused
"""
        for model, port in models.items()
    )
    return f"""model_list:
{entries}general_settings:
  master_key: {master_key}
litellm_settings:
  telemetry: false
"""


@contextlib.contextmanager
def proxy(
    executable: Path, models: Mapping[str, int], core: int | None, nice: int = 0
) -> Iterator[tuple[procs.Server, str]]:
    """`litellm --config` in front of `models` (name to upstream port); yields the server (its
    cold start included) and its key."""
    key = "sk-" + secrets.token_urlsafe(24)
    port = procs.free_port()
    with tempfile.TemporaryDirectory(prefix="kvfence-litellm-") as tmp:
        config = Path(tmp) / "config.yaml"
        config.write_text(_config(models, key))
        cmd = [str(executable), "--config", str(config), "--port", str(port)]
        cmd += ["--host", "127.0.0.1", "--num_workers", "1"]
        env = {"LITELLM_LOG": "ERROR", "PATH": "/usr/bin:/bin", "HOME": tmp}
        start = time.monotonic()
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=tmp,
            preexec_fn=procs.placement(core, nice),
        )
        try:
            _wait_ready(port, proc, deadline_s=120)
            yield procs.Server(proc.pid, port, time.monotonic() - start), key
        finally:
            procs.stop(proc)


def _wait_ready(port: int, proc: subprocess.Popen[bytes], deadline_s: float) -> None:
    deadline = time.monotonic() + deadline_s
    url = f"http://127.0.0.1:{port}/health/liveliness"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"litellm exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as answer:
                if answer.status == 200:
                    return
        except OSError:  # refused, reset, timed out: not up yet
            time.sleep(0.2)
    raise RuntimeError(f"litellm was not ready within {deadline_s} s")
