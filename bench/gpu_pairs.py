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

import dataclasses
import importlib.util
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fa4tune.config import ForwardConfig  # noqa: E402

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
    return _bench("gpu_overlap").twin_bench_main(
        argv, __doc__.splitlines()[0], "pairs", DEFAULT_CONFIGS, "tile_m x tile_n x threads[:q][:sN], comma-separated",
        parse_configs, timing_candidates, run_timing, default_suites="chunked")


def run_timing(experiment, settings, problems, target, runs: int, candidates_of) -> None:
    """Part 2: per problem, the candidates gated and timed interleaved, `runs` times; medians and speedups."""
    from fa4tune.harness import gpu

    medians, names = _bench("gpu_overlap").time_interleaved(experiment, settings, problems, runs, candidates_of,
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
