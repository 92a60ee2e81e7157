"""Metric lines (exact format) and the per-problem tables."""

import io
import math
import re

import pytest

from fa4tune.harness import gpu, metrics
from fa4tune.harness.measurement import Measurement, ProblemResult, geomean
from fa4tune.targets import get_target

SM120 = get_target("sm120")


def result(problem, direction, tflops, status="ok", vram=100.0, **extra):
    return ProblemResult(problem, direction, status, tflops=tflops if status == "ok" else None,
                         ms_median=1.0 if status == "ok" else None, peak_vram_mb=vram, **extra)


def measurement(kind, pc, *results):
    return Measurement(kind, pc, {"tile_m": 128}, tuple(results), "sm120", "NVIDIA H200", "emulated")


RUN = [
    measurement("fwd", "d128-noncausal-bf16", result("a", "fwd", 380.0, vram=2000.0), result("b", "fwd", 250.0)),
    measurement("fwd", "d256-noncausal-bf16", result("c", "fwd", None, status="infeasible", vram=None, reason="smem_capacity: needs 131072 B")),
    measurement("bwd", "d128-noncausal-bf16", result("a", "bwd", 240.0, vram=3500.0), result("b", "bwd", 200.0)),
]


def test_metric_lines_are_exactly_name_colon_value_in_order():
    summary = metrics.summarize(RUN, SM120, "NVIDIA H200", "emulated")
    lines = metrics.metric_lines(summary)
    assert [line.split(": ")[0] for line in lines] == list(metrics.METRIC_NAMES)
    assert all(re.fullmatch(r"[a-z_0-9]+: \S.*", line) for line in lines)
    values = dict(line.split(": ", 1) for line in lines)
    assert values["fwd_tflops_peak"] == "380.0"
    assert values["fwd_tflops_geomean"] == f"{geomean([380.0, 250.0]):.1f}"
    assert values["bwd_tflops_peak"] == "240.0"
    assert values["bwd_tflops_geomean"] == f"{geomean([240.0, 200.0]):.1f}"
    assert values["peak_vram_mb"] == "3500.0"
    assert values["configs_ok"] == "2/3"  # the infeasible d256 config is counted, not hidden
    assert (values["target"], values["device"], values["mode"]) == ("sm120", "NVIDIA H200", "emulated")


def test_utilization_is_percent_of_the_peak_of_the_device_that_ran_the_kernels():
    summary = metrics.summarize(RUN, SM120, "NVIDIA H200", "emulated")
    line = metrics.metric_lines(summary)[4]
    percent = 100 * geomean([380.0, 250.0]) / 989.4  # the H200's dense bf16 peak, not the RTX 5090's 209.5
    assert line.startswith(f"fwd_utilization: {percent:.1f}% of NVIDIA H200 peak 989.4 TFLOPS (H200 SXM dense bf16")
    assert line.endswith("; emulated: the sm120 kernels ran on NVIDIA H200, not on a sm120 GPU")
    assert metrics.metric_number(line.split(": ", 1)[1]) == pytest.approx(round(percent, 1))


def test_an_h200_rate_is_never_divided_by_the_targets_peak():
    # The bug: 256 TFLOPS measured on an H200 over the RTX 5090's 209.5 printed 122 %.
    run = [measurement("fwd", "d128-noncausal-bf16", result("a", "fwd", 256.0))]
    value = metrics.parse_metric_lines("\n".join(metrics.metric_lines(metrics.summarize(run, SM120, "NVIDIA H200", "emulated"))))
    assert metrics.metric_number(value["fwd_utilization"]) == pytest.approx(25.9)


def test_a_native_run_divides_by_its_own_gpus_peak_and_says_nothing_of_emulation():
    summary = metrics.summarize(RUN, SM120, "NVIDIA GeForce RTX 5090", "native")
    value = metrics.metric_lines(summary)[4].split(": ", 1)[1]
    percent = 100 * geomean([380.0, 250.0]) / SM120.peak_tflops_bf16
    assert value == f"{percent:.1f}% of NVIDIA GeForce RTX 5090 peak 209.5 TFLOPS ({SM120.peak_source})"


def test_an_unknown_device_prints_nan_with_the_reason():
    summary = metrics.summarize(RUN, SM120, "NVIDIA A100-SXM4-80GB", "emulated")
    value = metrics.parse_metric_lines("\n".join(metrics.metric_lines(summary)))["fwd_utilization"]
    assert value.startswith("nan (no dense bf16 peak known for device 'NVIDIA A100-SXM4-80GB': fa4tune/harness/gpu.py DEVICE_PEAKS knows ")
    assert "NVIDIA H200" in value and "%" not in value and "emulated: the sm120 kernels ran on NVIDIA A100-SXM4-80GB" in value
    assert math.isnan(metrics.metric_number(value))
    assert summary.fwd_tflops_geomean is not None and summary.fwd_utilization is None  # the rate is kept, only the ratio is unknown


def test_device_peaks_are_keyed_by_torchs_names_and_reuse_the_targets_figures():
    assert gpu.device_peak("NVIDIA H200").tflops == gpu.device_peak("NVIDIA H100 80GB HBM3").tflops == 989.4
    assert gpu.device_peak("NVIDIA GeForce RTX 5090").tflops == SM120.peak_tflops_bf16 == 209.5
    pro = get_target("sm120-pro6000")
    assert gpu.device_peak("NVIDIA RTX PRO 6000 Blackwell Workstation Edition") == gpu.DevicePeak(pro.peak_tflops_bf16, pro.peak_source)
    # 188 SMs x 2617 MHz x 1024 dense bf16 FLOPs per SM per clock (the RTX 5090's 512 is GeForce's halved fp32-accumulate rate)
    assert pro.peak_tflops_bf16 == pytest.approx(188 * 2.617e9 * 1024 / 1e12, abs=0.05)
    assert gpu.device_peak("NVIDIA H200 NVL") is None  # another clock and power limit: not guessed


def test_missing_values_print_nan_and_a_clean_run_is_ok():
    decode_only = [measurement("fwd", "d128-noncausal-gqa4-bf16", result("decode", "fwd", 50.0))]
    summary = metrics.summarize(decode_only, SM120, "NVIDIA GeForce RTX 5090", "native")
    values = metrics.parse_metric_lines("\n".join(["noise: x", "table | row", *metrics.metric_lines(summary)]))
    assert values["bwd_tflops_geomean"] == "nan" and values["bwd_tflops_peak"] == "nan"
    assert values["configs_ok"] == "1/1" and summary.status == "ok"
    assert "emulated" not in values["fwd_utilization"]
    assert metrics.metric_number(values["bwd_tflops_geomean"]) != metrics.metric_number(values["bwd_tflops_geomean"])  # nan


def timed(problem, direction, median, q1, q3, status="ok"):
    return ProblemResult(problem, direction, status, tflops=100.0 if status == "ok" else None, ms_median=median,
                         ms_min=q1 * 0.9, ms_max=q3 * 1.5, ms_q1=q1, ms_q3=q3)


def test_spread_lines_are_the_largest_iqr_percent_of_the_directions_ok_problems():
    run = [
        measurement("fwd", "d128-noncausal-bf16", timed("a", "fwd", 2.0, 1.99, 2.03), timed("b", "fwd", 1.0, 0.99, 1.01)),
        measurement("fwd", "d64-causal-bf16", timed("c", "fwd", 1.0, 0.8, 1.4, status="incorrect")),  # not timed: not counted
        measurement("bwd", "d128-noncausal-bf16", timed("a", "bwd", 4.0, 3.98, 4.02)),
    ]
    summary = metrics.summarize(run, SM120, "NVIDIA H200", "emulated")
    assert summary.fwd_spread_pct == pytest.approx(2.0) and summary.bwd_spread_pct == pytest.approx(1.0)
    values = metrics.parse_metric_lines("\n".join(metrics.metric_lines(summary)))
    assert (values["fwd_spread_pct"], values["bwd_spread_pct"]) == ("2.00", "1.00")
    assert metrics.METRIC_NAMES.index("fwd_spread_pct") == metrics.METRIC_NAMES.index("fwd_utilization") + 1
    text = render(metrics.problem_table(run, "t"))
    assert "IQR %" in text and "2.00" in text.splitlines()[next(i for i, ln in enumerate(text.splitlines()) if " a " in ln)]


def test_spread_lines_are_nan_without_a_timed_problem_of_that_direction():
    forward_only = [measurement("fwd", "d128-noncausal-gqa4-bf16", timed("decode", "fwd", 1.0, 0.99, 1.02))]
    values = metrics.parse_metric_lines("\n".join(metrics.metric_lines(metrics.summarize(forward_only, SM120, "cpu", "cpu"))))
    assert values["fwd_spread_pct"] == "3.00" and values["bwd_spread_pct"] == "nan"
    # results without quartiles (recorded before they were kept) give no spread, not a wrong one
    assert metrics.spread_pct(RUN[0].results, "fwd") is None


def render(table):
    buffer = io.StringIO()
    metrics.print_table(table, file=buffer)
    return buffer.getvalue()


def test_problem_table_shows_each_problem_status_and_reason():
    text = render(metrics.problem_table(RUN, "experiment.py per problem [target=sm120 device=NVIDIA H200 mode=emulated]"))
    assert "target=sm120 device=NVIDIA H200 mode=emulated" in text
    assert "infeasible" in text and "smem_capacity: needs 131072 B" in text
    assert "380.0" in text and "d128-noncausal-bf16" in text
    assert len(text.splitlines()) >= 5 + 5  # header, rule and one line per problem and direction


def test_comparison_table_puts_candidates_side_by_side():
    table = metrics.comparison_table({"sm120 upstream": RUN[:1], "torch sdpa": [measurement("fwd", "x", result("a", "fwd", 523.0))]}, "baselines")
    text = render(table)
    assert "fwd sm120 upstream" in text and "fwd torch sdpa" in text
    row = next(line for line in text.splitlines() if " a " in line)
    assert "380.0" in row and "523.0" in row
