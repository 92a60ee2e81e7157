"""The launch-bounded TMA forward (kernels/tma_bounded_forward_sm120.py, "sm120_tma_bounded") on a GPU: the gate over
a correctness matrix, then each problem's dispatch-table entry against its bounded twins, interleaved.

    FLASH_ATTENTION_ARCH=sm_120 FLASH_ATTENTION_NUM_SMS=132 python3 bench/gpu_bounded.py [--part matrix|timing|both]
        [--configs 64x64x128:q:3,...] [--suites chunked,standard] [--only SUBSTRING] [--runs 2]

Part 1, matrix: each --configs entry (tile_m x tile_n x num_threads[:q][:min_blocks_per_mp], one stage) as
sm120_tma_bounded over bench/gpu_overlap.py's matrix (decode to prefill lengths, head_dim 64/96/128, GQA 1/4/8,
seqlen_k never a tile multiple, causal bottom-right, batch 1/8; square prefills of odd lengths), the LSE gated too.
A row that is not ok fails the exit code.
Part 2, timing: per forward problem of --suites (decodes left out), the table's entry, its twin on the TMA class (same
tile, threads and Q_in_regs, one stage), that twin bounded at each min_blocks_per_mp its rules allow, and upstream's
SM120 defaults, gated, then timed interleaved in one step (fa4tune.harness.steps.measure_step); the whole list --runs
times, the order reversed in alternate runs. Per problem: each candidate's medians, its speedup over the TMA twin and
over upstream's defaults. On a GPU that is not SM 12.0 the SM120 kernels run emulated (label the figures).
"""

import dataclasses
import importlib.util
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fa4tune.config import ForwardConfig  # noqa: E402

BOUNDED, TMA = "sm120_tma_bounded", "sm120_tma"
DEFAULT_CONFIGS = "64x64x128:q:3,64x64x128:q:2,128x64x256:q:2"


def _bench(name: str):
    """bench/<name>.py as a module."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_configs(text: str) -> list[ForwardConfig]:
    """'64x64x128:q:3,...' as one-stage sm120_tma_bounded configs (min_blocks_per_mp last, 2 if absent); the flag
    `tma` makes one the unbounded sm120_tma (a dispatch candidate gated by the same matrix)."""
    configs = []
    for item in filter(None, text.split(",")):
        tile, *flags = item.split(":")
        tile_m, tile_n, threads = (int(x) for x in tile.split("x"))
        blocks = next((int(f) for f in flags if f.isdigit()), 2)
        if "tma" in flags:
            configs.append(ForwardConfig(tile_m, tile_n, threads, 1, "q" in flags, kernel=TMA))
            continue
        configs.append(ForwardConfig(tile_m, tile_n, threads, 1, "q" in flags, kernel=BOUNDED,
                                     extra={"min_blocks_per_mp": blocks}))
    return configs


def timing_candidates(experiment, problem, target) -> list[tuple[str, ForwardConfig]]:
    """The entry, its TMA twin, the twin bounded at every allowed min_blocks_per_mp, upstream's defaults (always)."""
    from fa4tune import defaults
    from fa4tune.feasibility import check_forward_problem
    from kernels.tma_bounded_forward_sm120 import MIN_BLOCKS_DOMAIN

    entry = experiment.forward_config(problem.problem_class)
    twin = dataclasses.replace(entry, num_stages=1, extra={}, kernel=TMA)
    named = [("table", entry), ("tma twin", twin)]
    named += [(f"bounded {n}", dataclasses.replace(twin, kernel=BOUNDED, extra={"min_blocks_per_mp": n})) for n in MIN_BLOCKS_DOMAIN]
    seen, out = set(), []
    for label, cfg in named:
        if cfg.key() not in seen and check_forward_problem(cfg, problem, target):
            seen.add(cfg.key())
            out.append((label, cfg))
    return out + [("upstream", defaults.upstream_forward(problem.problem_class))]


def main(argv=None) -> int:
    return _bench("gpu_overlap").twin_bench_main(
        argv, __doc__.splitlines()[0], "bounded", DEFAULT_CONFIGS, "tile_m x tile_n x threads[:q][:min_blocks], comma-separated",
        parse_configs, lambda experiment, problem, target, configs: timing_candidates(experiment, problem, target), run_timing)


def run_timing(experiment, settings, problems, target, runs: int, candidates_of) -> None:
    """Part 2: per problem, the candidates gated and timed interleaved, `runs` times; medians and speedups."""
    from fa4tune.harness import gpu

    medians, names = _bench("gpu_overlap").time_interleaved(experiment, settings, problems, runs, candidates_of,
                                                            label_width=10, name_width=58)
    print("\n| problem | candidate | config | ms (runs) | vs tma twin | vs upstream |\n|---|---|---|---|---|---|")
    best: list[float] = []
    for problem in problems:
        mean = {lab: sum(v) / len(v) for (p, lab), v in medians.items() if p == problem.label and len(v) == runs}
        for label in sorted(mean, key=lambda lab: mean[lab]):
            vs_tma = f"{mean['tma twin'] / mean[label]:.3f}" if "tma twin" in mean else ""
            vs_up = f"{mean['upstream'] / mean[label]:.3f}" if "upstream" in mean else ""
            ms = " / ".join(f"{v:.4f}" for v in medians[(problem.label, label)])
            print(f"| {problem.label} | {label} | {names[(problem.label, label)]} | {ms} | {vs_tma} | {vs_up} |")
        bounded = [mean[lab] for lab in mean if lab.startswith("bounded")]
        if bounded and "table" in mean and "upstream" in mean:
            best.append(mean["table"] / min(bounded))
    if best:
        g = math.exp(sum(math.log(v) for v in best) / len(best))
        print(f"geomean, the best bounded twin over the table's entry: {g:.3f} over {len(best)} problems")
    mode = gpu.select_mode(gpu.read_device(), target)
    print(f"mode: {mode} (SM120 kernels{' emulated on this device' if mode == 'emulated' else ''})")


if __name__ == "__main__":
    sys.exit(main())
