"""The TMA forward classes on a GPU: the gate over the correctness matrix for configs of any of them, then each
problem's dispatch-table entry against its twins on every TMA class, interleaved.

    FLASH_ATTENTION_ARCH=sm_120 FLASH_ATTENTION_NUM_SMS=132 python3 bench/gpu_twins.py [--part matrix|timing|both]
        [--configs 64x96x128:q:lpt,128x64x128:t] [--suites chunked,standard] [--only SUBSTRING] [--runs 2]

Part 1, matrix: each --configs entry (bench/common.py's tma notation: tile_m x tile_n x num_threads, `:q` for Q in
registers, `:sN` for N stages, `:tma` / `:lpt` / `:p` / `:t` for sm120_tma / sm120_tma_lpt / sm120_tma_paired /
sm120_tma_trimmed) over bench/common.py's matrix (seqlen_q 1-512, head_dim 64/96/128, GQA 1/4/8, seqlen_k never a
tile multiple, causal bottom-right and batch 1/8 alternating; square prefills of odd lengths, causal and not), the
LSE gated too; problems the static rules refuse for a config are left out for it. A row that is not ok fails the
exit code. This is the gate a change to a TMA class passes before it is timed or kept.
Part 2, timing: per forward problem of --suites (decodes left out), the table's entry, its twin on each TMA class
(same tile, threads and Q_in_regs, one stage: "tma twin", "lpt twin", "paired twin", "trimmed twin"; a twin equal to
the entry is timed once) and upstream's SM120 defaults, gated, then timed interleaved in one step, the whole list
--runs times, the order reversed in alternate runs. Per problem: each candidate's medians, its speedup over the TMA
twin and over upstream; then each twin's geomean over the TMA twin, causal problems and others apart. On a GPU that
is not SM 12.0 the SM120 kernels run emulated (label the figures).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (TMA_CLASSES, compile_ahead, config_name, default_compile_jobs, gate_matrix, geomean,  # noqa: E402
                          matrix_problems, mode_line, parse_tma_configs, prefill_problems, time_interleaved)
from fa4tune.config import ForwardConfig  # noqa: E402

DEFAULT_CONFIGS = "64x96x128:q:lpt,128x64x128:t"
TWIN_LABELS = {"tma": "tma twin", "lpt": "lpt twin", "p": "paired twin", "t": "trimmed twin"}


def twins(entry: ForwardConfig) -> list[tuple[str, ForwardConfig]]:
    """The table's entry, then its twin on each TMA class: the same tile, threads and Q_in_regs, one stage."""
    base = dataclasses.replace(entry, num_stages=1, extra={})
    return [("table", entry)] + [(TWIN_LABELS[flag], dataclasses.replace(base, kernel=kernel)) for flag, kernel in TMA_CLASSES.items()]


def timing_candidates(experiment, problem, target) -> list[tuple[str, ForwardConfig]]:
    """Part 2's labelled candidates for one problem: the entry and its twins the problem admits (a twin equal to the
    entry once), then upstream's defaults (always, as bench/table_vs_upstream.py times them)."""
    from fa4tune import defaults
    from fa4tune.feasibility import check_forward_problem

    seen, out = set(), []
    for label, cfg in twins(experiment.forward_config(problem.problem_class)):
        if cfg.key() not in seen and check_forward_problem(cfg, problem, target):
            seen.add(cfg.key())
            out.append((label, cfg))
    return out + [("upstream", defaults.upstream_forward(problem.problem_class))]


def summarize(problems, medians: dict, runs: int) -> tuple[list[str], dict]:
    """The markdown rows (one per problem and candidate, fastest first) and, per twin label, its speedups over the TMA
    twin split by (label, causal); a candidate counts only with all `runs` medians."""
    lines = ["| problem | candidate | ms (runs) | vs tma twin | vs upstream |", "|---|---|---|---|---|"]
    gains: dict[tuple[str, bool], list[float]] = {}
    for problem in problems:
        mean = {lab: sum(v) / len(v) for (p, lab), v in medians.items() if p == problem.label and len(v) == runs}
        twin = mean.get("tma twin", mean.get("table"))  # the entry is its own TMA twin when it is on sm120_tma
        for label in sorted(mean, key=lambda lab: mean[lab]):
            vs_twin = f"{twin / mean[label]:.3f}" if twin else ""
            vs_up = f"{mean['upstream'] / mean[label]:.3f}" if "upstream" in mean else ""
            ms = " / ".join(f"{v:.4f}" for v in medians[(problem.label, label)])
            lines.append(f"| {problem.label} | {label} | {ms} | {vs_twin} | {vs_up} |")
            if twin and label in TWIN_LABELS.values() and label != "tma twin":
                gains.setdefault((label, problem.causal), []).append(twin / mean[label])
    return lines, gains


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("matrix", "timing", "both"), default="both")
    parser.add_argument("--configs", default=DEFAULT_CONFIGS, help="bench/common.py's tma notation, comma-separated")
    parser.add_argument("--suites", default="chunked,standard")
    parser.add_argument("--only", default="", help="only problems whose label contains this")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--compile-jobs", type=int, default=default_compile_jobs())
    args = parser.parse_args(argv)
    configs = parse_tma_configs(args.configs)

    from fa4tune.feasibility import check_forward_problem
    from fa4tune.harness.candidates import load_experiment
    from fa4tune.harness.settings import EXPERIMENT_PATH, Settings, new_gate_seed
    from fa4tune.suites import load_suite
    from fa4tune.targets import get_target

    target = get_target()
    settings = Settings(gate_seed=new_gate_seed())
    experiment = load_experiment(EXPERIMENT_PATH)
    matrix = [p for p in matrix_problems() + prefill_problems() if args.only in p.label]
    problems = [p for suite in args.suites.split(",") for p in load_suite(suite)
                if args.only in p.label and p.problem_class.regime != "decode"]
    pairs = []
    if args.part in ("matrix", "both"):
        pairs += [("fwd", c, p) for c in configs for p in matrix if check_forward_problem(c, p, target)]
    if args.part in ("timing", "both"):
        pairs += [("fwd", c, p) for p in problems for _, c in timing_candidates(experiment, p, target)]
    compile_ahead(pairs, settings, args.compile_jobs)

    print(f"gate seed {settings.gate_seed}; configs: {', '.join(config_name(c) for c in configs)}", flush=True)
    failures = gate_matrix(configs, experiment, settings, matrix, target) if args.part in ("matrix", "both") else 0
    if args.part in ("timing", "both"):
        medians, _ = time_interleaved(experiment, settings, problems, args.runs,
                                      lambda problem: timing_candidates(experiment, problem, target))
        lines, gains = summarize(problems, medians, args.runs)
        print("\n" + "\n".join(lines))
        for (label, causal), values in sorted(gains.items()):
            print(f"geomean, the {label} over the TMA twin, {'causal' if causal else 'non-causal'}: "
                  f"{geomean(values):.3f} over {len(values)} problems")
        print(mode_line(target))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
