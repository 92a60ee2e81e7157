"""Split-KV forward (experiment.py's sm120_splitkv, issue #13) on a GPU: the harness's gate over the issue's correctness
matrix, then TFLOPS and the HBM bound on the decode suite against the dispatch table's config, upstream's SM120
defaults, FA4's own path and torch SDPA.

    FLASH_ATTENTION_ARCH=sm_120 FLASH_ATTENTION_NUM_SMS=132 python3 bench/gpu_splitkv.py [--part matrix|timing|both]
        [--configs 16x64x32x1:0,64x64x128x2:0,32x64x64x1q:0] [--kernel sm120_splitkv|sm120_splitkv_cluster] [--only SUBSTRING] [--rounds N] [--combine-launch pdl|stream]

Part 1, matrix (gate only, one timed round): every split config over seqlen_q in {1, 2, 8, 64, 512}, head_dim in
{64, 96, 128} and GQA in {1, 4, 8}, with seqlen_k never a multiple of tile_n, causal (bottom-right, sq < sk) on
alternate shapes and batch 1 or 8 on alternate shapes (every value of each axis is met with both causal settings),
each config once with its num_splits and once forced to 4 splits, so the split path runs whatever the heuristic
says; a `status` other than ok fails the row and the exit code. The LSE is gated too (attention() returns it).
Part 2, timing: for each problem of --suite (default: decode), every candidate gated, then timed interleaved in
one step (fa4tune.harness.steps.measure_step): the split configs, the dispatch table's config
(experiment.forward_config), upstream's SM120 defaults (fa4tune.defaults.upstream_forward: what upstream's
interface runs on SM120), FA4's own path for this GPU (flash_attn_func: SM90 kernels with split-KV on an H200, not
SM120 code: a reference) and torch SDPA. Each row: TFLOPS, ms, and the share of the HBM bound (reading K and V
once at the device's bandwidth: on a decode, the ceiling). On a GPU that is not SM 12.0 the SM120 kernels run
emulated: the 99 KB rule is SM120's, the speed is the device's (the heuristic's CTAs per SM are SM120's too, so
on an H200, with 228 KB per SM, it under-fills by up to 2x; --configs with explicit splits show how much).
"""

import argparse
import dataclasses
import itertools
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fa4tune.config import ForwardConfig, Problem  # noqa: E402
from fa4tune.suites import load_suite  # noqa: E402

# Spec-sheet HBM bandwidths (bytes/s), keyed as torch.cuda.get_device_properties names the GPU (as DEVICE_PEAKS is).
HBM_BANDWIDTH = {
    "NVIDIA H200": (4.8e12, "H200 SXM datasheet: 4.8 TB/s HBM3e"),
    "NVIDIA H100 80GB HBM3": (3.35e12, "H100 SXM datasheet: 3.35 TB/s HBM3"),
    "NVIDIA GeForce RTX 5090": (1.792e12, "RTX 5090 spec: 1792 GB/s GDDR7"),
    "NVIDIA RTX PRO 6000 Blackwell Workstation Edition": (1.792e12, "RTX PRO 6000 Blackwell spec: 1792 GB/s GDDR7"),
}
DEFAULT_CONFIGS = "16x64x32x1:0,16x64x32x2:0,32x64x64x2:0,64x64x128x2:0"
MATRIX_SEQLEN_Q = (1, 2, 8, 64, 512)
MATRIX_HEAD_DIMS = (64, 96, 128)
MATRIX_GQA = (1, 4, 8)
FORCED_SPLITS = 4
COLUMNS = ("problem", "candidate", "status", "TFLOPS", "ms", "% HBM bound", "max errors (error/tolerance)")


def parse_configs(text: str, kernel: str = "sm120_splitkv") -> list[ForwardConfig]:
    """'16x64x32x1:0,...' (tile_m x tile_n x num_threads x num_stages : num_splits; a `q` after the stages puts Q in
    registers: '32x64x64x1q:0') as configs of `kernel`."""
    configs = []
    for item in filter(None, text.split(",")):
        tile, splits = item.split(":")
        Q_in_regs = tile.endswith("q")
        tile_m, tile_n, threads, stages = (int(x) for x in tile.removesuffix("q").split("x"))
        configs.append(ForwardConfig(tile_m, tile_n, threads, stages, Q_in_regs, kernel=kernel, extra={"num_splits": int(splits)}))
    return configs


def matrix_problems() -> list[Problem]:
    """Issue #13's correctness matrix: every (seqlen_q, head_dim, GQA), causal and batch alternating, seqlen_k odd."""
    problems = []
    for i, (sq, hd, gqa) in enumerate(itertools.product(MATRIX_SEQLEN_Q, MATRIX_HEAD_DIMS, MATRIX_GQA)):
        causal, batch = i % 2 == 1, 8 if (i // 2) % 2 else 1
        sk = max(1000, sq + 300) + 37 * (i % 5)  # never a multiple of 16: the last KV block is always partial
        kv_heads = 2 if batch == 8 else 4
        problems.append(Problem(batch, sq, sk, kv_heads * gqa, kv_heads, hd, hd, causal, backward=False,
                                name=f"b{batch} sq{sq} sk{sk} d{hd} gqa{gqa}{' causal' if causal else ''}"))
    return problems


def hbm_bound(problem: Problem, bandwidth: float) -> tuple[float, float]:
    """(milliseconds, TFLOPS) of reading K and V once and Q, writing O once, at `bandwidth` bytes/s."""
    from fa4tune.harness.flops import problem_flops

    kv = problem.batch * problem.seqlen_k * problem.num_heads_kv * (problem.head_dim + problem.head_dim_v) * 2
    qo = problem.batch * problem.seqlen_q * problem.num_heads * (problem.head_dim + problem.head_dim_v) * 2
    seconds = (kv + qo) / bandwidth
    return seconds * 1e3, problem_flops(problem, "fwd") / seconds / 1e12


def format_errors(max_errors: dict) -> str:
    """'out 1.0e-02/1.6e-02 lse 3.1e-06/1.0e-05' from a ProblemResult's max_errors."""
    parts = []
    for name, value in max_errors.items():
        if not name.endswith("_tolerance"):
            tol = max_errors.get(f"{name}_tolerance")
            parts.append(f"{name} {value:.1e}" + (f"/{tol:.1e}" if tol is not None else ""))
    return " ".join(parts)


def print_row(row, widths=(34, 44, 12, 8, 9, 12)) -> None:
    print("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)) + "  " + str(row[-1]), flush=True)


def result_row(label: str, name: str, result, bound_ms: float | None) -> tuple:
    status = result.status if result.status == "ok" else f"{result.status}: {result.reason[:100]}"
    share = f"{100 * bound_ms / result.ms_median:.0f}%" if bound_ms and result.ms_median else ""
    return (label, name, status, f"{result.tflops:.2f}" if result.tflops else "",
            f"{result.ms_median:.4f}" if result.ms_median else "", share, format_errors(result.max_errors))


def config_name(cfg: ForwardConfig) -> str:
    splits = f" splits={cfg.extra_knobs['num_splits'] or 'auto'}" if "num_splits" in cfg.extra_knobs else ""
    return f"{cfg.kernel} {cfg.tile_m}x{cfg.tile_n} t{cfg.num_threads} s{cfg.num_stages}{' Q_in_regs' if cfg.Q_in_regs else ''}{splits}"


def matrix_configs(configs: list[ForwardConfig]) -> list[ForwardConfig]:
    """The configs as given, then each forced to FORCED_SPLITS (unless it already has them)."""
    return configs + [dataclasses.replace(c, extra={**c.extra_knobs, "num_splits": FORCED_SPLITS}) for c in configs
                      if c.extra_knobs["num_splits"] != FORCED_SPLITS]


def timing_configs(configs: list[ForwardConfig], experiment, problem: Problem) -> list[tuple[str, ForwardConfig]]:
    """Part 2's SM120 candidates for one problem: the split configs, the dispatch table's, upstream's defaults."""
    from fa4tune import defaults

    pc = problem.problem_class
    named = [(config_name(c), c) for c in configs]
    return named + [(f"dispatch table: {config_name(experiment.forward_config(pc))}", experiment.forward_config(pc)),
                    (f"upstream sm120 defaults: {config_name(defaults.upstream_forward(pc))}", defaults.upstream_forward(pc))]


def compile_jobs(configs, experiment, args) -> list[tuple[str, ForwardConfig, list[Problem]]]:
    """("fwd", config, problems) for every kernel the parts will run, grouped by search.evaluating.ahead.group_jobs."""
    from fa4tune.feasibility import check_forward_problem
    from fa4tune.targets import get_target
    from search.evaluating.ahead import group_jobs

    pairs = []
    if args.part in ("matrix", "both"):
        problems = [p for p in matrix_problems() if args.only in p.label]
        pairs += [("fwd", c, p) for c in matrix_configs(configs) for p in problems]
    if args.part in ("timing", "both"):
        for p in [p for p in load_suite(args.suite) if args.only in p.label]:
            pairs += [("fwd", c, p) for _, c in timing_configs(configs, experiment, p) if check_forward_problem(c, p, get_target())]
    return group_jobs(pairs)


def run_matrix(configs, experiment, settings, only: str) -> int:
    """Part 1: the gate over the matrix for every config (its num_splits, then forced); the number of failures."""
    from fa4tune.harness import evaluation

    gate_settings = dataclasses.replace(settings, rounds=1, warmup=1)
    failures = 0
    print(f"\n== correctness matrix: {len(matrix_configs(configs))} configs x {len(matrix_problems())} problems (gate) ==")
    print_row(COLUMNS)
    for cfg in matrix_configs(configs):
        problems = [p for p in matrix_problems() if only in p.label]
        m = evaluation.evaluate("fwd", cfg, problems, experiment, settings=gate_settings)
        for problem, result in zip(problems, m.results):
            failures += result.status != "ok"
            print_row(result_row(problem.label, config_name(cfg), result, None))
    print(f"matrix: {failures} failing row(s)")
    return failures


def run_timing(configs, experiment, settings, suite: str, only: str) -> None:
    """Part 2: every candidate gated and timed interleaved per problem; TFLOPS and the share of the HBM bound."""
    import torch

    from fa4tune.feasibility import check_forward_problem
    from fa4tune.harness import gpu
    from fa4tune.harness.candidates import experiment_candidate, fa4_candidate, sdpa_candidate
    from fa4tune.harness.steps import make_flusher, measure_step
    from fa4tune.targets import get_target

    device = torch.device("cuda")
    name = torch.cuda.get_device_properties(device).name
    bandwidth, source = HBM_BANDWIDTH.get(name.strip(), (None, "unknown: add it to HBM_BANDWIDTH"))
    target = get_target()
    print(f"\n== timing, suite {suite}: device {name}, HBM {bandwidth and bandwidth / 1e12} TB/s ({source}) ==")
    print_row(COLUMNS)
    flusher = make_flusher(device)
    for problem in [p for p in load_suite(suite) if only in p.label]:
        bwd = experiment.backward_config(problem.problem_class)
        candidates, skipped = [], []
        for label, cfg in timing_configs(configs, experiment, problem):
            verdict = check_forward_problem(cfg, problem, target)
            if verdict:
                candidates.append(experiment_candidate(experiment, cfg, bwd, name=label))
            else:
                skipped.append((label, str(verdict)))
        candidates += [fa4_candidate(), sdpa_candidate()]
        results = measure_step(problem, "fwd", candidates, device=device, settings=settings, flusher=flusher)
        bound_ms, bound_tflops = hbm_bound(problem, bandwidth) if bandwidth else (None, None)
        for candidate in candidates:
            print_row(result_row(problem.label, candidate.name, results[candidate.name], bound_ms))
        for label, why in skipped:
            print_row((problem.label, label, f"infeasible: {why[:100]}", "", "", "", ""))
        if bound_ms:
            print_row((problem.label, "HBM bound (K, V, Q, O once)", "", f"{bound_tflops:.2f}", f"{bound_ms:.4f}", "100%", ""))
    mode = gpu.select_mode(gpu.read_device(), target)
    print(f"\nmode: {mode} (SM120 kernels{' emulated on this device' if mode == 'emulated' else ''}; "
          "FA4's own path and SDPA run this device's own kernels)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("matrix", "timing", "both"), default="both")
    parser.add_argument("--configs", default=DEFAULT_CONFIGS, help="tile_m x tile_n x threads x stages : num_splits, comma-separated")
    parser.add_argument("--kernel", default="sm120_splitkv", choices=("sm120_splitkv", "sm120_splitkv_cluster"),
                        help="the split class the --configs run (sm120_splitkv_cluster: num_splits 2, 4 or 8)")
    parser.add_argument("--suite", default="decode")
    parser.add_argument("--only", default="", help="only problems whose label contains this")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (default: fa4tune.harness.settings.TIMED_ROUNDS)")
    parser.add_argument("--compile-jobs", type=int, default=max(1, (os.cpu_count() or 2) - 1),
                        help="CPU processes compiling every kernel ahead into the kernel cache (0: compile in the GPU process)")
    parser.add_argument("--combine-launch", choices=("pdl", "stream"), default="pdl",
                        help="the combine kernel as a programmatic dependent launch (the default) or plainly stream-ordered")
    args = parser.parse_args(argv)
    configs = parse_configs(args.configs, args.kernel)
    from fa4tune import sm120_interface

    sm120_interface.COMBINE_PDL = args.combine_launch == "pdl"

    from fa4tune.harness.candidates import load_experiment
    from fa4tune.harness.settings import EXPERIMENT_PATH, Settings, new_gate_seed

    settings = Settings(gate_seed=new_gate_seed())
    if args.rounds:
        settings = dataclasses.replace(settings, rounds=args.rounds)
    if args.compile_jobs:
        from search.evaluating.ahead import precompile, use_kernel_cache

        use_kernel_cache()
        precompile(compile_jobs(configs, load_experiment(EXPERIMENT_PATH), args), settings, args.compile_jobs,
                   name=config_name, log=lambda line: print(line, flush=True))

    import experiment
    print(f"gate seed {settings.gate_seed}; combine launch {args.combine_launch}; split configs: "
          f"{', '.join(config_name(c) for c in configs)}", flush=True)
    failures = run_matrix(configs, experiment, settings, args.only) if args.part in ("matrix", "both") else 0
    if args.part in ("timing", "both"):
        run_timing(configs, experiment, settings, args.suite, args.only)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
