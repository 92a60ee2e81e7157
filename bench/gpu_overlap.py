"""The overlapped TMA forward (kernels/tma_overlap_forward_sm120.py, "sm120_tma_overlap") on a GPU: the gate over a
correctness matrix, then each problem's dispatch-table entry against its TMA and overlapped twins, interleaved.

    FLASH_ATTENTION_ARCH=sm_120 FLASH_ATTENTION_NUM_SMS=132 python3 bench/gpu_overlap.py [--part matrix|timing|both]
        [--configs 64x64x128:q,128x64x256:q] [--suites chunked,standard] [--only SUBSTRING] [--runs 2]

Part 1, matrix (gate only, one timed round): each --configs entry as sm120_tma_overlap over bench/gpu_splitkv.py's
matrix (seqlen_q 1-512, head_dim 64/96/128, GQA 1/4/8, seqlen_k never a tile multiple, causal bottom-right and
batch 1/8 alternating) and a prefill matrix (seqlen_q = seqlen_k = 1000 and 3000, head_dim 64/96/128, GQA 1/4,
causal and not, and a non-causal seqlen_q > seqlen_k). The LSE is gated too. A row that is not ok fails the exit code.
Part 2, timing: per forward problem of --suites, the table's entry (experiment.forward_config), its twin on the TMA
class (same tile, threads and Q_in_regs, one stage), the overlapped twin, and upstream's SM120 defaults, gated, then
timed interleaved in one step (fa4tune.harness.steps.measure_step); the whole list --runs times, the order
reversed in alternate runs. Per problem: each candidate's medians and the overlapped twin's speedup over the TMA
twin and over upstream's defaults. On a GPU that is not SM 12.0 the SM120 kernels run emulated (label the figures).
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

from fa4tune.config import ForwardConfig, Problem  # noqa: E402
from fa4tune.suites import load_suite  # noqa: E402

OVERLAP, TMA = "sm120_tma_overlap", "sm120_tma"
DEFAULT_CONFIGS = "64x64x128:q,64x64x128,128x64x256:q,128x64x128:q"
PREFILL_SEQLENS = (1000, 3000)


def _splitkv_bench():
    """bench/gpu_splitkv.py as a module (its matrix and row formatting)."""
    spec = importlib.util.spec_from_file_location("gpu_splitkv", ROOT / "bench" / "gpu_splitkv.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_configs(text: str) -> list[ForwardConfig]:
    """'64x64x128:q,...' (tile_m x tile_n x num_threads, ':q' for Q_in_regs) as one-stage sm120_tma_overlap configs."""
    configs = []
    for item in filter(None, text.split(",")):
        tile, _, flags = item.partition(":")
        tile_m, tile_n, threads = (int(x) for x in tile.split("x"))
        configs.append(ForwardConfig(tile_m, tile_n, threads, 1, "q" in flags, kernel=OVERLAP))
    return configs


def prefill_problems() -> list[Problem]:
    """Square prefills of odd lengths, every head dim, GQA 1 and 4, causal and not; one non-causal sq > sk."""
    problems = []
    for sq in PREFILL_SEQLENS:
        for hd in (64, 96, 128):
            for gqa in (1, 4):
                for causal in (False, True):
                    batch = 2 if sq < 2000 else 1
                    problems.append(Problem(batch, sq, sq, 4 * gqa, 4, hd, hd, causal, backward=False,
                                            name=f"b{batch} s{sq} d{hd} gqa{gqa}{' causal' if causal else ''}"))
    problems.append(Problem(2, 777, 333, 8, 8, 128, 128, False, backward=False, name="b2 sq777 sk333 d128"))
    return problems


def twins(entry: ForwardConfig) -> list[tuple[str, ForwardConfig]]:
    """The table's entry, then the same tile / threads / Q_in_regs on the TMA class and on the overlapped one."""
    base = dataclasses.replace(entry, num_stages=1, extra={})
    return [("table", entry), ("tma twin", dataclasses.replace(base, kernel=TMA)),
            ("overlap twin", dataclasses.replace(base, kernel=OVERLAP))]


def name_of(cfg: ForwardConfig) -> str:
    extra = "".join(f" {k}={v}" for k, v in cfg.extra_knobs.items())
    return f"{cfg.kernel} {cfg.tile_m}x{cfg.tile_n} t{cfg.num_threads} s{cfg.num_stages}{' Qr' if cfg.Q_in_regs else ''}{extra}"


def timing_candidates(experiment, problem: Problem, target) -> list[tuple[str, ForwardConfig]]:
    """Part 2's feasible candidates for one problem, labelled: a twin equal to the entry is not timed twice;
    upstream's defaults always are (as bench/table_vs_upstream.py times them)."""
    from fa4tune import defaults
    from fa4tune.feasibility import check_forward_problem

    seen, out = set(), []
    for label, cfg in twins(experiment.forward_config(problem.problem_class)):
        if cfg.key() not in seen and check_forward_problem(cfg, problem, target):
            seen.add(cfg.key())
            out.append((label, cfg))
    return out + [("upstream", defaults.upstream_forward(problem.problem_class))]  # timed even where the table's


def main(argv=None) -> int:
    return twin_bench_main(argv, __doc__.splitlines()[0], "overlap", DEFAULT_CONFIGS, "tile_m x tile_n x threads[:q], comma-separated",
                           parse_configs, lambda experiment, problem, target, configs: timing_candidates(experiment, problem, target),
                           run_timing)


def twin_bench_main(argv, description: str, what: str, default_configs: str, configs_help: str, parse, candidates,
                    timing, default_suites: str = "chunked,standard", extra_matrix=None) -> int:
    """The command line of the benches that gate a kernel class's configs over the matrix and time them against the
    table's entries (this one, bench/gpu_bounded.py, bench/gpu_pairs.py): `parse(text)` makes --configs' configs,
    `candidates(experiment, problem, target, configs)` a problem's (label, config) list, and `timing(experiment,
    settings, problems, target, runs, candidates_of)` times them; `extra_matrix(configs)`, when given, more matrix
    problems for these configs. Returns 1 when a matrix row is not ok."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--part", choices=("matrix", "timing", "both"), default="both")
    parser.add_argument("--configs", default=default_configs, help=configs_help)
    parser.add_argument("--suites", default=default_suites)
    parser.add_argument("--only", default="", help="only problems whose label contains this")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--compile-jobs", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    args = parser.parse_args(argv)
    configs = parse(args.configs)
    sk = _splitkv_bench()

    from fa4tune.feasibility import check_forward_problem
    from fa4tune.harness.candidates import load_experiment
    from fa4tune.harness.settings import EXPERIMENT_PATH, Settings, new_gate_seed
    from fa4tune.targets import get_target

    target = get_target()
    settings = Settings(gate_seed=new_gate_seed())
    experiment = load_experiment(EXPERIMENT_PATH)
    extra = extra_matrix(configs) if extra_matrix else []
    matrix = [p for p in sk.matrix_problems() + prefill_problems() + extra if args.only in p.label]
    problems = [p for suite in args.suites.split(",") for p in load_suite(suite) if args.only in p.label and p.problem_class.regime != "decode"]
    candidates_of = lambda problem: candidates(experiment, problem, target, configs)  # noqa: E731
    pairs = []
    if args.part in ("matrix", "both"):
        pairs += [("fwd", c, p) for c in configs for p in matrix if check_forward_problem(c, p, target)]
    if args.part in ("timing", "both"):
        pairs += [("fwd", c, p) for p in problems for _, c in candidates_of(p)]
    if args.compile_jobs:
        from search.evaluating.ahead import group_jobs, precompile, use_kernel_cache

        use_kernel_cache()
        precompile(group_jobs(pairs), settings, args.compile_jobs, name=name_of, log=lambda line: print(line, flush=True))

    print(f"gate seed {settings.gate_seed}; {what} configs: {', '.join(name_of(c) for c in configs)}", flush=True)
    failures = run_matrix(configs, experiment, settings, matrix, target, sk) if args.part in ("matrix", "both") else 0
    if args.part in ("timing", "both"):
        timing(experiment, settings, problems, target, args.runs, candidates_of)
    return 1 if failures else 0


def run_matrix(configs, experiment, settings, matrix, target, sk) -> int:
    """Part 1: the gate over the matrix for each config; the number of rows that are not ok."""
    from fa4tune.feasibility import check_forward_problem
    from fa4tune.harness import evaluation

    gate_settings = dataclasses.replace(settings, rounds=1, warmup=1)
    failures = rows = 0
    print(f"\n== correctness matrix: {len(configs)} configs x {len(matrix)} problems (gate) ==")
    sk.print_row(sk.COLUMNS)
    for cfg in configs:
        problems = [p for p in matrix if check_forward_problem(cfg, p, target)]
        m = evaluation.evaluate("fwd", cfg, problems, experiment, settings=gate_settings)
        for problem, result in zip(problems, m.results):
            rows += 1
            failures += result.status != "ok"
            sk.print_row(sk.result_row(problem.label, name_of(cfg), result, None))
    print(f"matrix: {rows} rows, {failures} failing")
    return failures


def time_interleaved(experiment, settings, problems, runs: int, candidates_of, label_width: int = 13,
                     name_width: int = 44) -> tuple[dict, dict]:
    """Per problem, the candidates `candidates_of(problem)` (label, config) gated and timed in one step, `runs` times
    (order reversed on odd runs); returns the ok medians by (problem label, candidate label) and the config names."""
    import torch

    from fa4tune.harness.candidates import experiment_candidate
    from fa4tune.harness.steps import make_flusher, measure_step

    device = torch.device("cuda")
    flusher = make_flusher(device)
    medians: dict[tuple[str, str], list[float]] = {}
    names: dict[tuple[str, str], str] = {}
    for run in range(runs):
        for problem in problems:
            named = candidates_of(problem)
            if run % 2:
                named.reverse()
            bwd = experiment.backward_config(problem.problem_class)
            candidates = [experiment_candidate(experiment, cfg, bwd, name=label) for label, cfg in named]
            results = measure_step(problem, "fwd", candidates, device=device, settings=settings, flusher=flusher)
            for label, cfg in named:
                r = results[label]
                names[(problem.label, label)] = name_of(cfg)
                status = r.status if r.status == "ok" else f"{r.status}: {r.reason[:120]}"
                print(f"run {run + 1}  {problem.label:34s} {label:{label_width}s} {name_of(cfg):{name_width}s} {status:8s} "
                      f"{r.tflops or 0:7.1f} TFLOPS {r.ms_median or 0:.4f} ms", flush=True)
                if r.status == "ok":
                    medians.setdefault((problem.label, label), []).append(r.ms_median)
    return medians, names


def run_timing(experiment, settings, problems, target, runs: int, candidates_of) -> None:
    """Part 2: per problem, the candidates gated and timed interleaved, `runs` times; medians and speedups."""
    from fa4tune.harness import gpu

    medians, names = time_interleaved(experiment, settings, problems, runs, candidates_of)
    print("\n| problem | candidate | config | ms (runs) | vs tma twin | vs upstream |\n|---|---|---|---|---|---|")
    ratios = {"vs tma twin": [], "vs upstream": [], "table vs upstream": []}
    for problem in problems:
        mean = {lab: sum(v) / len(v) for (p, lab), v in medians.items() if p == problem.label and len(v) == runs}
        for label in ("table", "tma twin", "overlap twin", "upstream"):
            if label not in mean:
                continue
            vs_tma = f"{mean['tma twin'] / mean[label]:.3f}" if "tma twin" in mean else ""
            vs_up = f"{mean['upstream'] / mean[label]:.3f}" if "upstream" in mean else ""
            ms = " / ".join(f"{v:.4f}" for v in medians[(problem.label, label)])
            print(f"| {problem.label} | {label} | {names[(problem.label, label)]} | {ms} | {vs_tma} | {vs_up} |")
        if {"overlap twin", "tma twin", "upstream", "table"} <= set(mean):
            ratios["vs tma twin"].append(mean["tma twin"] / mean["overlap twin"])
            ratios["vs upstream"].append(mean["upstream"] / mean["overlap twin"])
            ratios["table vs upstream"].append(mean["upstream"] / mean["table"])
    for what, values in ratios.items():
        if values:
            g = math.exp(sum(math.log(v) for v in values) / len(values))
            print(f"geomean, {'table' if what.startswith('table') else 'overlap twin'} "
                  f"{what.removeprefix('table ')}: {g:.3f} over {len(values)} problems")
    mode = gpu.select_mode(gpu.read_device(), target)
    print(f"mode: {mode} (SM120 kernels{' emulated on this device' if mode == 'emulated' else ''})")


if __name__ == "__main__":
    sys.exit(main())
