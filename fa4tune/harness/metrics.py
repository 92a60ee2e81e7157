"""What a harness run prints: a per-problem table (rich), then exactly one `name: value` line per metric.

The metric lines are the interface to people and programs (`grep '^fwd_tflops_geomean:' run.log`):

    fwd_tflops_peak, fwd_tflops_geomean, bwd_tflops_peak, bwd_tflops_geomean,
    fwd_utilization, fwd_spread_pct, bwd_spread_pct, peak_vram_mb, configs_ok, target, device, mode

Geomeans and peaks are over the problems whose status is ok; `configs_ok: N/M` counts the configs (one
per direction and problem class) whose every problem passed, so a run that lost problems says so there.
A metric with no value (no backward problem, or none passed) prints `nan`. `fwd_utilization` is the
forward geomean as a percent of the dense bf16 peak of the device that ran the kernels (fa4tune.harness.gpu's
DEVICE_PEAKS), and the line names that device, its peak and the peak's source; an emulated run says so,
since its rate is another GPU's. A device the table does not know prints `nan` and says why: a rate
divided by some other GPU's peak is a wrong figure (an H200's rate over the RTX 5090's peak read 122 %).

`fwd_spread_pct` / `bwd_spread_pct` are the run's timing noise in that direction: the largest interquartile
range of one problem's timed calls, in percent of its median, over the ok problems: the log's summary
(program.md's keep decision, fa4tune.keep, reads each problem's own quartiles from results.tsv). The IQR, as in
fa4tune.harness.timing.is_improvement: min and max follow single outliers (on the H200 the median over problems
of (max - min) / median was 4-7 % while the geomeans of three runs moved 0.2 % forward and 1.0 % backward:
docs/measurements/logs/2026-11-30-h200-stability.json, "after"); the largest over the problems, because a
geomean moves less than its noisiest problem does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

from fa4tune.harness import gpu
from fa4tune.harness.measurement import Measurement, ProblemResult, geomean
from fa4tune.targets import Target

METRIC_NAMES = (
    "fwd_tflops_peak", "fwd_tflops_geomean", "bwd_tflops_peak", "bwd_tflops_geomean",
    "fwd_utilization", "fwd_spread_pct", "bwd_spread_pct", "peak_vram_mb", "configs_ok", "target", "device", "mode",
)


@dataclass(frozen=True)
class RunSummary:
    """The metrics of one run over a suite."""

    fwd_tflops_peak: float | None
    fwd_tflops_geomean: float | None
    bwd_tflops_peak: float | None
    bwd_tflops_geomean: float | None
    fwd_utilization: float | None  # percent of peak_tflops, the peak of `device`
    peak_tflops: float | None  # None: DEVICE_PEAKS does not know `device`
    peak_source: str
    fwd_spread_pct: float | None  # largest IQR / median of a forward problem's timed calls, percent
    bwd_spread_pct: float | None
    peak_vram_mb: float | None
    configs_ok: int
    configs_total: int
    target: str
    device: str
    mode: str

    @property
    def status(self) -> str:
        return "ok" if self.configs_total and self.configs_ok == self.configs_total else "partial"


def _ok_rates(results: Iterable[ProblemResult], direction: str) -> list[float]:
    return [r.tflops for r in results if r.direction == direction and r.status == "ok" and r.tflops]


def spread_pct(results: Iterable[ProblemResult], direction: str) -> float | None:
    """The largest interquartile range of a problem's timed calls, in percent of its median, over the direction's
    ok problems (None when none has quartiles)."""
    spreads = [100.0 * (r.ms_q3 - r.ms_q1) / r.ms_median for r in results
               if r.direction == direction and r.status == "ok" and r.ms_median and r.ms_q1 is not None and r.ms_q3 is not None]
    return max(spreads) if spreads else None


def summarize(measurements: Sequence[Measurement], target: Target, device: str, mode: str) -> RunSummary:
    """Peaks, geomeans, utilization, peak memory and the ok count of a run's measurements."""
    results = [r for m in measurements for r in m.results]
    fwd, bwd = _ok_rates(results, "fwd"), _ok_rates(results, "bwd")
    fwd_geomean = geomean(fwd) if fwd else None
    peak = gpu.device_peak(device)
    memory = [r.peak_vram_mb for r in results if r.peak_vram_mb is not None]
    return RunSummary(
        fwd_tflops_peak=max(fwd) if fwd else None,
        fwd_tflops_geomean=fwd_geomean,
        bwd_tflops_peak=max(bwd) if bwd else None,
        bwd_tflops_geomean=geomean(bwd) if bwd else None,
        fwd_utilization=100.0 * fwd_geomean / peak.tflops if fwd_geomean and peak else None,
        peak_tflops=peak.tflops if peak else None,
        peak_source=peak.source if peak else "",
        fwd_spread_pct=spread_pct(results, "fwd"),
        bwd_spread_pct=spread_pct(results, "bwd"),
        peak_vram_mb=max(memory) if memory else None,
        configs_ok=sum(1 for m in measurements if m.ok),
        configs_total=len(measurements),
        target=target.name,
        device=device,
        mode=mode,
    )


def format_number(value: float | None) -> str:
    """One decimal, or 'nan' for a missing value."""
    return "nan" if value is None else f"{value:.1f}"


def metric_lines(summary: RunSummary) -> list[str]:
    """The twelve `name: value` lines, in METRIC_NAMES order."""
    values = {
        "fwd_tflops_peak": format_number(summary.fwd_tflops_peak),
        "fwd_tflops_geomean": format_number(summary.fwd_tflops_geomean),
        "bwd_tflops_peak": format_number(summary.bwd_tflops_peak),
        "bwd_tflops_geomean": format_number(summary.bwd_tflops_geomean),
        "fwd_utilization": utilization_text(summary),
        "fwd_spread_pct": "nan" if summary.fwd_spread_pct is None else f"{summary.fwd_spread_pct:.2f}",
        "bwd_spread_pct": "nan" if summary.bwd_spread_pct is None else f"{summary.bwd_spread_pct:.2f}",
        "peak_vram_mb": format_number(summary.peak_vram_mb),
        "configs_ok": f"{summary.configs_ok}/{summary.configs_total}",
        "target": summary.target,
        "device": summary.device,
        "mode": summary.mode,
    }
    return [f"{name}: {values[name]}" for name in METRIC_NAMES]


def utilization_text(summary: RunSummary) -> str:
    """'12.2% of NVIDIA H200 peak 989.4 TFLOPS (source); emulated: ...', or 'nan (why)' for an unknown device."""
    if summary.peak_tflops is None:
        known = ", ".join(gpu.DEVICE_PEAKS)
        text = (f"nan (no dense bf16 peak known for device {summary.device!r}: fa4tune/harness/gpu.py DEVICE_PEAKS "
                f"knows {known})")
    else:
        percent = "nan" if summary.fwd_utilization is None else f"{summary.fwd_utilization:.1f}%"
        text = f"{percent} of {summary.device} peak {summary.peak_tflops:.1f} TFLOPS ({summary.peak_source})"
    if summary.mode == gpu.EMULATED:
        text += f"; emulated: the {summary.target} kernels ran on {summary.device}, not on a {summary.target} GPU"
    return text


def parse_metric_lines(text: str) -> dict[str, str]:
    """The metric values of a run log (the last occurrence of each name wins)."""
    values = {}
    for line in text.splitlines():
        name, sep, value = line.partition(": ")
        if sep and name in METRIC_NAMES:
            values[name] = value
    return values


def metric_number(value: str) -> float:
    """The number at the start of a metric value ('143.9% of ...' -> 143.9, 'nan' -> nan)."""
    head = value.split()[0].rstrip("%") if value.split() else "nan"
    try:
        return float(head)
    except ValueError:
        return math.nan


# ------------------------------------------------------------------------------------------------
# Tables (rich).
# ------------------------------------------------------------------------------------------------


def _rate(r: ProblemResult | None) -> str:
    if r is None:
        return ""
    if r.status != "ok":
        return f"[red]{r.status}[/red]"
    return f"{r.tflops:.1f}" if r.tflops else "?"


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def problem_timings(measurements) -> dict:
    """Each (direction, problem)'s status and timed-call quartiles, keyed "fwd <label>": results.tsv keeps them in
    its config JSON so that a keep decision (fa4tune.keep) can compare one problem across runs."""
    out = {}
    for m in measurements:
        for r in m.results:
            out[f"{r.direction} {r.problem}"] = {"class": m.problem_class, "status": r.status, "ms_median": r.ms_median,
                                                 "ms_q1": r.ms_q1, "ms_q3": r.ms_q3}
    return out


def _iqr_pct(r: ProblemResult) -> str:
    """The problem's share of the spread line: its IQR in percent of its median."""
    spread = spread_pct([r], r.direction)
    return "" if spread is None else f"{spread:.2f}"


def _gate_margin(r: ProblemResult) -> str:
    """Worst error/tolerance ratio of the gate (below 1 passes)."""
    ratios = [
        r.max_errors[name] / r.max_errors[f"{name}_tolerance"]
        for name in ("out", "lse", "dq", "dk", "dv")
        if name in r.max_errors and r.max_errors.get(f"{name}_tolerance")
    ]
    return f"{max(ratios):.2f}" if ratios else ""


def problem_table(measurements: Sequence[Measurement], title: str):
    """One row per (problem, direction): status, TFLOPS, time (median, min, max, IQR %), memory, gate margin, reason."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(title), title_justify="left")
    numbers = ("TFLOPS", "median ms", "min ms", "max ms", "IQR %", "VRAM MB", "gate err/tol")
    for column in ("problem", "dir", "class", "status", *numbers, "config / reason"):
        table.add_column(column, justify="right" if column in numbers else "left")
    for m in measurements:
        config = " ".join(f"{k}={v}" for k, v in m.config.items() if k != "kernel")
        for r in m.results:
            table.add_row(
                escape(r.problem), r.direction, escape(m.problem_class), r.status if r.status == "ok" else f"[red]{r.status}[/red]",
                _rate(r) if r.status == "ok" else "", _ms(r.ms_median), _ms(r.ms_min), _ms(r.ms_max), _iqr_pct(r),
                "" if r.peak_vram_mb is None else f"{r.peak_vram_mb:.0f}", _gate_margin(r),
                escape(config if r.status == "ok" else r.reason),
            )
    return table


def comparison_table(candidates: dict[str, Sequence[Measurement]], title: str):
    """One row per problem, a forward and a backward TFLOPS column per candidate (baselines side by side)."""
    from rich.markup import escape
    from rich.table import Table

    by_key: dict[tuple[str, str], dict[str, ProblemResult]] = {}
    problems: list[str] = []
    for name, measurements in candidates.items():
        for m in measurements:
            for r in m.results:
                if r.problem not in problems:
                    problems.append(r.problem)
                by_key.setdefault((r.problem, r.direction), {})[name] = r
    table = Table(title=escape(title), title_justify="left")
    table.add_column("problem")
    for direction in ("fwd", "bwd"):
        for name in candidates:
            table.add_column(escape(f"{direction} {name}"), justify="right")
    for problem in problems:
        row = [escape(problem)]
        for direction in ("fwd", "bwd"):
            for name in candidates:
                row.append(_rate(by_key.get((problem, direction), {}).get(name)))
        table.add_row(*row)
    return table


def print_table(table, file=None) -> None:
    """Render a rich table wide enough for a log file (no wrapping at 80 columns)."""
    import sys

    from rich.console import Console

    Console(file=file or sys.stdout, width=220, soft_wrap=False).print(table)
