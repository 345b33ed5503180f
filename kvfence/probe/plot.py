"""The plot of a probe run: the first-token time distributions (ECDFs) of each arm, the
control beside the cross phase. Needs matplotlib (the `probe-report` extra), imported only here.

Invariant: drawn from the measurements alone (times, arms, phases): no prompt, no credential.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from kvfence.probe.errors import MissingExtra
from kvfence.probe.method import ProbeResult
from kvfence.probe.rounds import Arm, Phase, times

COLOURS = {Arm.HIT: "#d62728", Arm.MISS: "#1f77b4", Arm.PARTIAL: "#9467bd"}
PANELS = (
    (Phase.CONTROL, "control: A primes, A probes"),
    (Phase.CROSS, "cross: A primes, B probes"),
)


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingExtra("--plot needs matplotlib: pip install 'kvfence[probe-report]'") from None
    return plt


def write_plot(result: ProbeResult, path: Path, title: str) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharex=True, sharey=True)
    for ax, (phase, label) in zip(axes, PANELS, strict=True):
        for arm in Arm:
            values = sorted(t * 1000 for t in times(result.measurements, phase, arm))
            if not values:
                continue
            fractions = [(i + 1) / len(values) for i in range(len(values))]
            median = statistics.median(values)
            ax.step(
                [values[0], *values],
                [0.0, *fractions],
                where="post",
                color=COLOURS[arm],
                label=f"{arm} (n={len(values)}, median {median:.0f} ms)",
            )
        ax.set_title(label)
        ax.set_xlabel("time to first token (ms)")
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize="small")
    axes[0].set_ylabel("share of requests answered")
    fig.suptitle(f"{title}: {result.decision.outcome}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
