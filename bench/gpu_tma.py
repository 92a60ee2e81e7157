"""TMA-fed vs cp.async SM120 forward on a GPU: the harness's correctness gate and TFLOPS, per problem of a suite.

    FLASH_ATTENTION_ARCH=sm_120 FLASH_ATTENTION_NUM_SMS=132 python3 bench/gpu_tma.py [--only SUBSTRING] [--isolated]

For every forward problem of the suite: the dispatch table's cp.async config (experiment.forward_config), then
the same tile and thread count with kernel="sm120_tma" at each TMA stage count, each through fa4tune.harness.evaluation.evaluate
(gate first, then interleaved timing). A row per (problem, config) is printed as soon as it is measured, then
a summary: geomean TFLOPS per variant over the problems where every variant passed. On a GPU that is not
SM 12.0 these are the SM120 kernels emulated on it (the 99 KB rule is SM120's, the speed is the device's).
`--isolated` runs each problem in a child process (fa4tune.harness.evaluation.evaluate_isolated): a kernel that hangs or faults
becomes a `timeout` / `crash` row instead of ending the script.
"""

import argparse
import dataclasses
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fa4tune.config import ForwardConfig, Problem  # noqa: E402
from fa4tune.suites import load_suite  # noqa: E402

TMA_STAGES = (1, 2)
COLUMNS = ("problem", "kernel", "stages", "status", "TFLOPS", "ms", "vs cp.async", "max errors (error/tolerance)")


def variants(base: ForwardConfig, stages=TMA_STAGES) -> list[ForwardConfig]:
    """The cp.async config first, then the TMA kernel with the same tile and threads at each stage count."""
    base = dataclasses.replace(base, kernel="sm120")
    return [base] + [dataclasses.replace(base, kernel="sm120_tma", num_stages=s, Q_in_regs=False) for s in stages]


def variant_name(cfg: ForwardConfig) -> str:
    """The summary's name for a variant: the dispatch table's cp.async config, or the TMA kernel at a stage count."""
    return "sm120 (dispatch table)" if cfg.kernel == "sm120" else f"sm120_tma num_stages={cfg.num_stages}"


def plan(problems: list[Problem], experiment, stages=TMA_STAGES) -> list[tuple[Problem, list[ForwardConfig]]]:
    """(problem, configs to evaluate) for every problem (forward runs on all of them)."""
    return [(p, variants(experiment.forward_config(p.problem_class), stages)) for p in problems]


def format_errors(max_errors: dict) -> str:
    """'out 1.0e-02/1.6e-02 lse 3.1e-06/1.0e-05' from a ProblemResult's max_errors."""
    parts = []
    for name, value in max_errors.items():
        if name.endswith("_tolerance"):
            continue
        tol = max_errors.get(f"{name}_tolerance")
        parts.append(f"{name} {value:.1e}" + (f"/{tol:.1e}" if tol is not None else ""))
    return " ".join(parts)


def format_row(problem: Problem, cfg: ForwardConfig, result, baseline_tflops) -> tuple:
    """One table row from a ProblemResult; `vs cp.async` is the TFLOPS ratio to the cp.async config's."""
    ratio = f"{result.tflops / baseline_tflops:.3f}" if result.tflops and baseline_tflops else ""
    status = result.status if result.status == "ok" else f"{result.status}: {result.reason[:80]}"
    return (
        problem.label, f"{cfg.kernel} {cfg.tile_m}x{cfg.tile_n} t{cfg.num_threads}", str(cfg.num_stages), status,
        f"{result.tflops:.1f}" if result.tflops else "", f"{result.ms_median:.3f}" if result.ms_median else "",
        ratio, format_errors(result.max_errors),
    )


def print_row(row, widths=(26, 24, 6, 10, 8, 8, 11)) -> None:
    print("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)) + "  " + str(row[-1]), flush=True)


def geomean(values) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="standard")
    parser.add_argument("--only", default="", help="only problems whose label contains this")
    parser.add_argument("--stages", default=",".join(map(str, TMA_STAGES)), help="TMA stage counts, e.g. 1,2")
    parser.add_argument("--isolated", action="store_true", help="each problem in a child process (hangs become timeouts)")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (default: fa4tune.harness.settings.TIMED_ROUNDS)")
    args = parser.parse_args(argv)

    from fa4tune.harness import evaluation  # imported late so that --help works anywhere
    from fa4tune.harness.settings import EXPERIMENT_PATH, Settings, new_gate_seed

    import experiment

    stages = tuple(int(s) for s in args.stages.split(","))
    problems = [p for p in load_suite(args.suite) if args.only in p.label]
    settings = Settings(gate_seed=new_gate_seed())
    if args.rounds:
        settings = dataclasses.replace(settings, rounds=args.rounds)
    print(f"suite {args.suite}, {len(problems)} forward problems, gate seed {settings.gate_seed}, TMA stages {stages}", flush=True)
    print_row(COLUMNS)
    tflops: dict[str, dict[str, float]] = {}
    device = mode = ""
    for problem, configs in plan(problems, experiment, stages):
        baseline = None
        for cfg in configs:
            if args.isolated:
                m = evaluation.evaluate_isolated("fwd", cfg, [problem], EXPERIMENT_PATH, settings=settings)
            else:
                m = evaluation.evaluate("fwd", cfg, [problem], experiment, settings=settings)
            device, mode = m.device, m.mode
            result = m.results[0]
            if cfg.kernel == "sm120":
                baseline = result.tflops if result.status == "ok" else None
            tflops.setdefault(variant_name(cfg), {})
            if result.status == "ok":
                tflops[variant_name(cfg)][problem.label] = result.tflops
            print_row(format_row(problem, cfg, result, baseline))
    print(f"\ndevice: {device}, mode: {mode} (SM120 kernels{' emulated on this device' if mode == 'emulated' else ''})")
    common = set.intersection(*(set(by) for by in tflops.values())) if tflops else set()
    for name, by in tflops.items():
        value = f"{geomean([by[p] for p in common]):.1f}" if common else "n/a"
        print(f"geomean TFLOPS, {name}: {value} (over the {len(common)} problems where every variant passed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
