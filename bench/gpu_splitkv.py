"""Split-KV forward (experiment.py's sm120_splitkv, issue #13) on a GPU: the harness's gate over the issue's correctness
matrix, then TFLOPS and the HBM bound on the decode suite against the dispatch table's config, upstream's SM120
defaults, FA4's own path and torch SDPA.

    FLASH_ATTENTION_ARCH=sm_120 FLASH_ATTENTION_NUM_SMS=132 python3 bench/gpu_splitkv.py [--part matrix|timing|both]
        [--configs 16x64x32x1:0,64x64x128x2:0,32x64x64x1q:0] [--only SUBSTRING] [--rounds N] [--combine-launch pdl|stream]
        [--out decode-table.jsonl]

Part 1, matrix (gate only, one timed round): every split config (bench/common.py's split notation) over seqlen_q in {1, 2, 8, 64, 512}, head_dim in
{64, 96, 128} and GQA in {1, 4, 8}, with seqlen_k never a multiple of tile_n, causal (bottom-right, sq < sk) on
alternate shapes and batch 1 or 8 on alternate shapes (every value of each axis is met with both causal settings),
each config once with its num_splits and once forced to 4 splits, so the split path runs whatever the heuristic
says; a `status` other than ok fails the row and the exit code. The LSE is gated too (attention() returns it).
Part 2, timing: for each problem of --suite (default: decode), every candidate gated, then timed interleaved in
one step (fa4tune.harness.steps.measure_step): the split configs, the dispatch table's config
(experiment.forward_config), upstream's SM120 defaults (fa4tune.defaults.upstream_forward: what upstream's
interface runs on SM120), FA4's own path for this GPU (flash_attn_func: SM90 kernels with split-KV on an H200, not
SM120 code: a reference) and torch SDPA. Each row: TFLOPS, ms, and the share of the HBM bound (reading K and V
once at the device's bandwidth: on a decode, the ceiling). `--out` also writes the rows as JSON lines, each with its
role (ROLES): what `python -m search export --decode-table` puts in the split-KV patch's pull request. On a GPU that is not SM 12.0 the SM120 kernels run
emulated: the 99 KB rule is SM120's, the speed is the device's (the heuristic's CTAs per SM are SM120's too, so
on an H200, with 228 KB per SM, it under-fills by up to 2x; --configs with explicit splits show how much).
"""

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (COLUMNS, compile_ahead, config_name, default_compile_jobs, gate_matrix,  # noqa: E402
                          matrix_problems, mode_line, print_row, result_row)
from bench.common import parse_split_configs as parse_configs  # noqa: E402
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
# a timing row's role, for --out: the dispatch table's config, upstream's SM120 defaults, the two references
TABLE, UPSTREAM, SDPA, FA4_OWN, SPLIT_CONFIG = "table", "upstream sm120", "torch sdpa", "fa4 own path", "split config"
FORCED_SPLITS = 4


def hbm_bound(problem: Problem, bandwidth: float) -> tuple[float, float]:
    """(milliseconds, TFLOPS) of reading K and V once and Q, writing O once, at `bandwidth` bytes/s."""
    from fa4tune.harness.flops import problem_flops

    kv = problem.batch * problem.seqlen_k * problem.num_heads_kv * (problem.head_dim + problem.head_dim_v) * 2
    qo = problem.batch * problem.seqlen_q * problem.num_heads * (problem.head_dim + problem.head_dim_v) * 2
    seconds = (kv + qo) / bandwidth
    return seconds * 1e3, problem_flops(problem, "fwd") / seconds / 1e12


def matrix_configs(configs: list[ForwardConfig]) -> list[ForwardConfig]:
    """The configs as given, then each forced to FORCED_SPLITS (unless it already has them)."""
    return configs + [dataclasses.replace(c, extra={**c.extra_knobs, "num_splits": FORCED_SPLITS}) for c in configs
                      if c.extra_knobs["num_splits"] != FORCED_SPLITS]


def timing_configs(configs: list[ForwardConfig], experiment, problem: Problem) -> list[tuple[str, ForwardConfig]]:
    """Part 2's SM120 candidates for one problem: the split configs, the dispatch table's, upstream's defaults."""
    return [(label, cfg) for label, cfg, _ in _timing_roles(configs, experiment, problem)]


def _timing_roles(configs, experiment, problem: Problem) -> list[tuple[str, ForwardConfig, str]]:
    from fa4tune import defaults

    pc = problem.problem_class
    named = [(config_name(c), c, SPLIT_CONFIG) for c in configs]
    return named + [(f"dispatch table: {config_name(experiment.forward_config(pc))}", experiment.forward_config(pc), TABLE),
                    (f"upstream sm120 defaults: {config_name(defaults.upstream_forward(pc))}", defaults.upstream_forward(pc),
                     UPSTREAM)]


def table_row(problem: Problem, role: str, name: str, result, device: str, mode: str) -> dict:
    """One --out line: the problem, the candidate's role and name, its status, TFLOPS and ms, the device and mode."""
    return {"problem": problem.label, "problem_class": problem.problem_class.name, "role": role, "name": name,
            "status": result.status, "tflops": result.tflops, "ms": result.ms_median, "device": device, "mode": mode}


def compile_pairs(configs, experiment, args) -> list[tuple[str, ForwardConfig, Problem]]:
    """("fwd", config, problem) for every kernel the parts will run: the matrix's, then the timing's feasible ones."""
    from fa4tune.feasibility import check_forward_problem
    from fa4tune.targets import get_target

    pairs = []
    if args.part in ("matrix", "both"):
        problems = [p for p in matrix_problems() if args.only in p.label]
        pairs += [("fwd", c, p) for c in matrix_configs(configs) for p in problems]
    if args.part in ("timing", "both"):
        for p in [p for p in load_suite(args.suite) if args.only in p.label]:
            pairs += [("fwd", c, p) for _, c in timing_configs(configs, experiment, p) if check_forward_problem(c, p, get_target())]
    return pairs


def run_timing(configs, experiment, settings, suite: str, only: str, out: Path | None = None) -> None:
    """Part 2: every candidate gated and timed interleaved per problem; TFLOPS and the share of the HBM bound; the rows
    also as JSON lines in `out`, written as each problem finishes."""
    import json

    import torch

    from fa4tune.feasibility import check_forward_problem
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
    mode = mode_line(target)
    if out is not None:
        out.write_text("")
    for problem in [p for p in load_suite(suite) if only in p.label]:
        bwd = experiment.backward_config(problem.problem_class)
        candidates, skipped, roles = [], [], {}
        for label, cfg, role in _timing_roles(configs, experiment, problem):
            verdict = check_forward_problem(cfg, problem, target)
            if verdict:
                candidates.append(experiment_candidate(experiment, cfg, bwd, name=label))
                roles[label] = role
            else:
                skipped.append((label, str(verdict)))
        fa4, sdpa = fa4_candidate(), sdpa_candidate()
        candidates += [fa4, sdpa]
        roles.update({fa4.name: FA4_OWN, sdpa.name: SDPA})
        results = measure_step(problem, "fwd", candidates, device=device, settings=settings, flusher=flusher)
        bound_ms, bound_tflops = hbm_bound(problem, bandwidth) if bandwidth else (None, None)
        for candidate in candidates:
            print_row(result_row(problem.label, candidate.name, results[candidate.name], bound_ms))
        if out is not None:
            with out.open("a") as stream:
                for candidate in candidates:
                    row = table_row(problem, roles[candidate.name], candidate.name, results[candidate.name], name, mode)
                    stream.write(json.dumps(row) + "\n")
        for label, why in skipped:
            print_row((problem.label, label, f"infeasible: {why[:100]}", "", "", "", ""))
        if bound_ms:
            print_row((problem.label, "HBM bound (K, V, Q, O once)", "", f"{bound_tflops:.2f}", f"{bound_ms:.4f}", "100%", ""))
    print(f"\n{mode}; FA4's own path and SDPA run this device's own kernels")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("matrix", "timing", "both"), default="both")
    parser.add_argument("--configs", default=DEFAULT_CONFIGS, help="tile_m x tile_n x threads x stages : num_splits, comma-separated")
    parser.add_argument("--suite", default="decode")
    parser.add_argument("--only", default="", help="only problems whose label contains this")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (default: fa4tune.harness.settings.TIMED_ROUNDS)")
    parser.add_argument("--compile-jobs", type=int, default=default_compile_jobs(),
                        help="CPU processes compiling every kernel ahead into the kernel cache (0: compile in the GPU process)")
    parser.add_argument("--combine-launch", choices=("pdl", "stream"), default="pdl",
                        help="the combine kernel as a programmatic dependent launch (the default) or plainly stream-ordered")
    parser.add_argument("--out", type=Path, default=None,
                        help="also write the timing rows as JSON lines (for `search export --decode-table`)")
    args = parser.parse_args(argv)
    configs = parse_configs(args.configs)
    from fa4tune import sm120_interface

    sm120_interface.COMBINE_PDL = args.combine_launch == "pdl"

    from fa4tune.harness.candidates import load_experiment
    from fa4tune.harness.settings import EXPERIMENT_PATH, Settings, new_gate_seed

    settings = Settings(gate_seed=new_gate_seed())
    if args.rounds:
        settings = dataclasses.replace(settings, rounds=args.rounds)
    compile_ahead(compile_pairs(configs, load_experiment(EXPERIMENT_PATH), args), settings, args.compile_jobs)

    from fa4tune.harness.candidates import load_experiment
    from fa4tune.harness.settings import EXPERIMENT_PATH as _EXPERIMENT

    experiment = load_experiment(_EXPERIMENT)  # the static rules and the pin first (guards.admit), as every measuring path
    print(f"gate seed {settings.gate_seed}; combine launch {args.combine_launch}; split configs: "
          f"{', '.join(config_name(c) for c in configs)}", flush=True)
    matrix = [p for p in matrix_problems() if args.only in p.label]
    failures = gate_matrix(matrix_configs(configs), experiment, settings, matrix) if args.part in ("matrix", "both") else 0
    if args.part in ("timing", "both"):
        run_timing(configs, experiment, settings, args.suite, args.only, args.out)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
