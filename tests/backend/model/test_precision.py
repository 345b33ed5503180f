"""`--dtype auto`: bfloat16 only on hardware that multiplies bfloat16 natively, float32 on a CPU
that would emulate it (and under the environment caps that emulate such a CPU here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from backend.model.precision import Hardware, choose_dtype, cpu_flags

REPO_ROOT = Path(__file__).resolve().parents[3]
# AMD EPYC (Zen 4): AVX-512 with BF16; torch 2.13 reports AVX512 kernels and native oneDNN bf16.
BF16_FLAGS = frozenset({"avx2", "avx512f", "avx512_bf16"})
NATIVE_BF16 = Hardware("cpu", BF16_FLAGS, True, None, "AVX512")
# AMD EPYC (Zen 2/3): AVX2 only; oneDNN has no native bf16 there.
AVX2_ONLY = Hardware("cpu", frozenset({"avx2", "fma"}), False, None, "AVX2")
# The first host with its kernels capped to AVX2 (ONEDNN_MAX_CPU_ISA, ATEN_CPU_CAPABILITY).
CAPPED = Hardware("cpu", BF16_FLAGS, False, "AVX2", "AVX2")
# Intel Skylake-SP: AVX-512 but no bf16 instructions (oneDNN would emulate them).
SKYLAKE = Hardware("cpu", frozenset({"avx2", "avx512f"}), True, None, "AVX512")
# Intel Sapphire Rapids with AMX, and an Arm Neoverse V1 with BF16.
AMX = Hardware("cpu", frozenset({"avx512f", "avx512_bf16", "amx_bf16"}), True, None, "AVX512")
ARM = Hardware("cpu", frozenset({"asimd", "bf16"}), True, None, "SVE256")


@pytest.mark.parametrize(
    ("hw", "dtype"),
    [
        (NATIVE_BF16, torch.bfloat16),
        (AMX, torch.bfloat16),
        (ARM, torch.bfloat16),
        (AVX2_ONLY, torch.float32),
        (CAPPED, torch.float32),
        (SKYLAKE, torch.float32),
        (Hardware("cpu", BF16_FLAGS, True, "AVX512_CORE", "AVX512"), torch.float32),
        (Hardware("cpu", BF16_FLAGS, True, "avx512_core_bf16", "AVX512"), torch.bfloat16),
        (Hardware("cuda", cuda_bf16=True), torch.bfloat16),
        (Hardware("cuda", cuda_bf16=False), torch.float32),
    ],
)
def test_auto_picks_bfloat16_only_where_it_is_native(hw: Hardware, dtype: torch.dtype) -> None:
    choice = choose_dtype(None, hw)
    assert choice.dtype == dtype
    assert choice.reason.startswith("auto: ")
    assert choose_dtype("auto", hw) == choice


def test_the_reason_names_what_decided() -> None:
    native = choose_dtype(None, NATIVE_BF16).reason
    assert "avx512_bf16" in native and "native" in native
    capped = choose_dtype(None, CAPPED).reason
    assert "oneDNN bf16: no" in capped and "ONEDNN_MAX_CPU_ISA=AVX2" in capped
    assert "no bfloat16 instructions" in choose_dtype(None, AVX2_ONLY).reason


@pytest.mark.parametrize("name", ["float32", "bfloat16", "float16"])
def test_an_explicit_dtype_always_wins(name: str) -> None:
    for hw in (NATIVE_BF16, AVX2_ONLY, Hardware("cuda")):
        choice = choose_dtype(name, hw)
        assert choice.name == name and choice.reason == f"--dtype {name}"
    with pytest.raises(ValueError, match="unknown dtype"):
        choose_dtype("int4", NATIVE_BF16)


def test_cpu_flags_are_read_from_x86_and_arm_cpuinfo(tmp_path: Path) -> None:
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512_bf16\n\n")
    assert cpu_flags(x86) == {"fpu", "avx2", "avx512_bf16"}
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd bf16\n")
    assert "bf16" in cpu_flags(arm)
    assert cpu_flags(tmp_path / "missing") == frozenset()


def test_isa_caps_in_the_environment_make_auto_pick_float32() -> None:
    """How an AVX2-only host is emulated on a bigger one: oneDNN and ATen read the caps at
    start-up, so the check runs in a fresh interpreter."""
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2", ATEN_CPU_CAPABILITY="avx2")
    code = (
        "import torch\n"
        "from backend.model.load import pick_dtype\n"
        "c = pick_dtype(None, torch.device('cpu'))\n"
        "print(c.name)\n"
        "print(c.reason)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert out[0] == "float32"
    assert "ONEDNN_MAX_CPU_ISA=AVX2" in out[1]
