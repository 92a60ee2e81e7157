"""The TMA forward with warp pairs (kernels/tma_pairs_forward_sm120.py, "sm120_tma_pairs") on a GPU: the gate over a
correctness matrix, then each problem's dispatch-table entry against its TMA twin and the pairs configs, interleaved.

    FLASH_ATTENTION_ARCH=sm_120 FLASH_ATTENTION_NUM_SMS=132 python3 bench/gpu_pairs.py [--part matrix|timing|both]
        [--configs 64x64x128:q,128x64x256:q] [--suites chunked] [--only SUBSTRING] [--runs 2]

Part 1, matrix: each --configs entry (tile_m x tile_n x num_threads, `:q` for Q in registers, `:s2` for 2 stages) as
sm120_tma_pairs over bench/gpu_overlap.py's matrix (bench/gpu_splitkv.py's: seqlen_q 1-512, head_dim 64/96/128, GQA
1/4/8, seqlen_k never a tile multiple, causal bottom-right, batch 1/8; and square prefills of odd lengths, causal and
not), the LSE gated too. A row that is not ok fails the exit code.
Part 2, timing: per forward problem of --suites (decodes left out), the table's entry, its TMA twin (same tile,
threads and Q_in_regs, one stage), every --configs entry the problem admits, and upstream's SM120 defaults, gated,
then timed interleaved in one step (fa4tune.harness.steps.measure_step); the whole list --runs times, the order
reversed in alternate runs. Per problem: each candidate's medians and its speedup over the table and over upstream.
On a GPU that is not SM 12.0 the SM120 kernels run emulated (label the figures).
"""

import argparse
import dataclasses
import importlib.util
import math
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fa4tune.config import ForwardConfig  # noqa: E402
from fa4tune.suites import load_suite  # noqa: E402

PAIRS, TMA = "sm120_tma_pairs", "sm120_tma"
DEFAULT_CONFIGS = "64x64x128:q"


def _bench(name: str):
    """bench/<name>.py as a module."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_configs(text: str) -> list[ForwardConfig]:
    """'64x64x128:q,64x64x128:s2,...' as sm120_tma_pairs configs (one stage unless `:sN`)."""
    configs = []
    for item in filter(None, text.split(",")):
        tile, *flags = item.split(":")
        tile_m, tile_n, threads = (int(x) for x in tile.split("x"))
        stages = next((int(f[1:]) for f in flags if f.startswith("s") and f[1:].isdigit()), 1)
        configs.append(ForwardConfig(tile_m, tile_n, threads, stages, "q" in flags, kernel=PAIRS))
    return configs


def timing_candidates(experiment, problem, target, configs) -> list[tuple[str, ForwardConfig]]:
    """The entry, its TMA twin, each pairs config the problem admits, upstream's defaults (always)."""
    from fa4tune import defaults
    from fa4tune.feasibility import check_forward_problem

    entry = experiment.forward_config(problem.problem_class)
    named = [("table", entry), ("tma twin", dataclasses.replace(entry, num_stages=1, extra={}, kernel=TMA))]
    named += [(f"pairs {i + 1}", cfg) for i, cfg in enumerate(configs)]
    seen, out = set(), []
    for label, cfg in named:
        if cfg.key() not in seen and check_forward_problem(cfg, problem, target):
            seen.add(cfg.key())
            out.append((label, cfg))
    return out + [("upstream", defaults.upstream_forward(problem.problem_class))]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("matrix", "timing", "both"), default="both")
    parser.add_argument("--configs", default=DEFAULT_CONFIGS, help="tile_m x tile_n x threads[:q][:sN], comma-separated")
    parser.add_argument("--suites", default="chunked")
    parser.add_argument("--only", default="", help="only problems whose label contains this")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--compile-jobs", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    args = parser.parse_args(argv)
    configs = parse_configs(args.configs)
    overlap, sk = _bench("gpu_overlap"), _bench("gpu_splitkv")

    from fa4tune.feasibility import check_forward_problem
    from fa4tune.harness.candidates import load_experiment
    from fa4tune.harness.settings import EXPERIMENT_PATH, Settings, new_gate_seed
    from fa4tune.targets import get_target

    target = get_target()
    settings = Settings(gate_seed=new_gate_seed())
    experiment = load_experiment(EXPERIMENT_PATH)
    matrix = [p for p in sk.matrix_problems() + overlap.prefill_problems() if args.only in p.label]
    problems = [p for suite in args.suites.split(",") for p in load_suite(suite) if args.only in p.label and p.problem_class.regime != "decode"]
    candidates_of = lambda problem: timing_candidates(experiment, problem, target, configs)  # noqa: E731
    pairs = []
    if args.part in ("matrix", "both"):
        pairs += [("fwd", c, p) for c in configs for p in matrix if check_forward_problem(c, p, target)]
    if args.part in ("timing", "both"):
        pairs += [("fwd", c, p) for p in problems for _, c in candidates_of(p)]
    if args.compile_jobs:
        from search.evaluating.ahead import group_jobs, precompile, use_kernel_cache

        use_kernel_cache()
        precompile(group_jobs(pairs), settings, args.compile_jobs, name=overlap.name_of, log=lambda line: print(line, flush=True))
    import experiment

    print(f"gate seed {settings.gate_seed}; pairs configs: {', '.join(overlap.name_of(c) for c in configs)}", flush=True)
    failures = overlap.run_matrix(configs, experiment, settings, matrix, target, sk) if args.part in ("matrix", "both") else 0
    if args.part in ("timing", "both"):
        run_timing(experiment, settings, problems, target, args.runs, overlap, candidates_of)
    return 1 if failures else 0


def run_timing(experiment, settings, problems, target, runs: int, overlap, candidates_of) -> None:
    """Part 2: per problem, the candidates gated and timed interleaved, `runs` times; medians and speedups."""
    from fa4tune.harness import gpu

    medians, names = overlap.time_interleaved(experiment, settings, problems, runs, candidates_of,
                                              label_width=10, name_width=44)
    print("\n| problem | candidate | config | ms (runs) | vs table | vs upstream |\n|---|---|---|---|---|---|")
    best: list[float] = []
    for problem in problems:
        mean = {lab: sum(v) / len(v) for (p, lab), v in medians.items() if p == problem.label and len(v) == runs}
        for label in sorted(mean, key=lambda lab: mean[lab]):
            vs_table = f"{mean['table'] / mean[label]:.3f}" if "table" in mean else ""
            vs_up = f"{mean['upstream'] / mean[label]:.3f}" if "upstream" in mean else ""
            ms = " / ".join(f"{v:.4f}" for v in medians[(problem.label, label)])
            print(f"| {problem.label} | {label} | {names[(problem.label, label)]} | {ms} | {vs_table} | {vs_up} |")
        ours = [mean[lab] for lab in mean if lab.startswith("pairs")]
        if ours and "table" in mean:
            best.append(mean["table"] / min(ours))
    if best:
        g = math.exp(sum(math.log(v) for v in best) / len(best))
        print(f"geomean, the best pairs config over the table's entry: {g:.3f} over {len(best)} problems")
    mode = gpu.select_mode(gpu.read_device(), target)
    print(f"mode: {mode} (SM120 kernels{' emulated on this device' if mode == 'emulated' else ''})")


if __name__ == "__main__":
    sys.exit(main())
