"""Which dtype the model computes in when the operator asks for `auto`: bfloat16 only where the
hardware multiplies bfloat16 matrices natively, float32 everywhere else.

Invariant: the choice is a pure function of a `Hardware` description (unit-tested on every
kind of host); an explicit --dtype always wins; the reason names the facts that decided it.
On a CPU without bfloat16 instructions torch emulates bfloat16 matrix products about 10x slower
than float32 ones (prefill of 308 tokens: 3.5 s against 0.56 s), so `auto` never picks it there.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# /proc/cpuinfo flags of bfloat16 matrix instructions (x86: AVX512-BF16, AMX; Arm: BF16).
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
# oneDNN ISA levels (ONEDNN_MAX_CPU_ISA) at or above which its bfloat16 kernels are native.
_ONEDNN_BF16_ISAS = frozenset(
    {"ALL", "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16",
     "AVX10_1_512", "AVX10_1_512_AMX", "AVX10_1_512_AMX_FP16", "AVX10_2_512",
     "AVX10_2_512_AMX_2"}
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Hardware:
    """What decides the dtype: the device kind and, on a CPU, its bfloat16 support."""

    device_type: str  # "cpu" or "cuda"
    cpu_flags: frozenset[str] = frozenset()  # /proc/cpuinfo flags (only BF16_FLAGS matter)
    onednn_bf16: bool = False  # torch's oneDNN runs bfloat16 natively (honours its ISA cap)
    onednn_isa_cap: str | None = None  # ONEDNN_MAX_CPU_ISA, when set
    aten_capability: str = ""  # torch.backends.cpu.get_cpu_capability() (ATEN_CPU_CAPABILITY)
    cuda_bf16: bool = False  # torch.cuda.is_bf16_supported()


@dataclass(frozen=True, slots=True)
class DtypeChoice:
    dtype: torch.dtype
    reason: str

    @property
    def name(self) -> str:
        return str(self.dtype).removeprefix("torch.")


def choose_dtype(requested: str | None, hw: Hardware) -> DtypeChoice:
    """requested: None or "auto", or a name in DTYPES (which always wins)."""
    if requested not in (None, "auto"):
        if requested not in DTYPES:
            raise ValueError(f"unknown dtype {requested!r} (choose from auto, {', '.join(DTYPES)})")
        return DtypeChoice(DTYPES[requested], f"--dtype {requested}")
    if hw.device_type == "cuda":
        if hw.cuda_bf16:
            return DtypeChoice(torch.bfloat16, "auto: the GPU supports bfloat16")
        return DtypeChoice(torch.float32, "auto: the GPU has no bfloat16 support")
    return _cpu_choice(hw)


def _cpu_choice(hw: Hardware) -> DtypeChoice:
    flags = [f for f in BF16_FLAGS if f in hw.cpu_flags]
    cap = (hw.onednn_isa_cap or "").upper()
    facts = (
        f"cpu bf16 flags: {', '.join(flags) or 'none'}; oneDNN bf16: "
        f"{'yes' if hw.onednn_bf16 else 'no'}; ATen kernels: {hw.aten_capability or '?'}"
        + (f"; ONEDNN_MAX_CPU_ISA={hw.onednn_isa_cap}" if cap else "")
    )
    if not flags:
        why = "the CPU has no bfloat16 instructions"
    elif not hw.onednn_bf16:
        why = "torch's oneDNN does not run bfloat16 natively here"
    elif cap and cap not in _ONEDNN_BF16_ISAS:
        why = "ONEDNN_MAX_CPU_ISA caps oneDNN below its bfloat16 kernels"
    else:
        return DtypeChoice(torch.bfloat16, f"auto: native bfloat16 matrix products ({facts})")
    return DtypeChoice(
        torch.float32, f"auto: {why}, so bfloat16 would be emulated, about 10x slower ({facts})"
    )


def detect_hardware(device: torch.device) -> Hardware:
    """This process's view of the hardware (environment caps included)."""
    if device.type == "cuda":
        return Hardware("cuda", cuda_bf16=bool(torch.cuda.is_bf16_supported()))
    isa_cap = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
    return Hardware(
        device_type=device.type,
        cpu_flags=cpu_flags(),
        onednn_bf16=_onednn_bf16(),
        onednn_isa_cap=isa_cap,
        aten_capability=str(torch.backends.cpu.get_cpu_capability()),
    )


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The first processor's feature flags ("flags" on x86, "Features" on Arm); empty if none."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def _onednn_bf16() -> bool:
    if not torch._C._has_mkldnn:
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch build without the operator
        return False
