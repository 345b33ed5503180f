"""The host a benchmark ran on, in one dictionary every result file carries: CPU model and the
flags that decide CPU inference speed, cores, the torch build, ISA caps set in the environment,
and the load average when the run started.

Invariant: reading the description never fails a benchmark: what cannot be read is None.
"""

from __future__ import annotations

import importlib
import os
import platform
import re
from pathlib import Path
from typing import Any

# The flags that change CPU inference speed the most (figures differ up to 4x between hosts).
SPEED_FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)
# Environment variables that cap what torch's kernels use (how an AVX2 host is emulated).
ISA_CAPS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "OMP_NUM_THREADS")
_CONFIG_KEYS = ("BLAS_INFO", "USE_MKLDNN", "USE_OPENMP", "CUDA_VERSION", "TORCH_VERSION")


def describe(torch_info: bool = True) -> dict[str, Any]:
    """The host description; with torch_info, also this interpreter's torch build."""
    cpu = _cpuinfo()
    flags = set(cpu.get("flags", "").split())
    load = os.getloadavg()
    out: dict[str, Any] = {
        "cpu_model": cpu.get("model name"),
        "cpu_flags": {f: f in flags for f in SPEED_FLAGS},
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_gib": _memory_gib(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "isa_caps": {k: os.environ[k] for k in ISA_CAPS if k in os.environ},
        "load_average_at_start": [round(x, 2) for x in load],
    }
    if torch_info:
        out["torch"] = torch_build()
    return out


def torch_build() -> dict[str, Any] | None:
    """Version, kernel capability in use, oneDNN/bfloat16 support and build settings of the
    torch this interpreter imports (None when it has none)."""
    try:
        torch = importlib.import_module("torch")
    except ImportError:
        return None
    info: dict[str, Any] = {
        "version": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "mkldnn": bool(torch.backends.mkldnn.is_available()),
    }
    try:
        info["onednn_bf16"] = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        info["onednn_bf16"] = None
    config = torch.__config__.show()
    for key in _CONFIG_KEYS:
        match = re.search(rf"{key}=([^,\n]+)", config)
        if match:
            info[key.lower()] = match.group(1).strip()
    onednn = re.search(r"MKL-DNN v([\d.]+)", config)
    info["onednn_version"] = onednn.group(1) if onednn else None
    if torch.cuda.is_available():
        info["cuda_device"] = torch.cuda.get_device_name(0)
    return info


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    path = Path("/proc/cpuinfo")
    fields: dict[str, str] = {}
    if not path.is_file():
        return {"model name": platform.processor() or platform.machine()}
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def _memory_gib() -> float | None:
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    return round(pages / 2**30, 1)


if __name__ == "__main__":
    import json

    print(json.dumps(describe(), indent=2))
