"""prepare.py: the fixed benchmark harness. The coding agent edits experiment.py, never this file.

Every evaluation in the project goes through the same steps: for each (config, problem, direction) the static
feasibility rules of the target (an infeasible config is never run), the correctness gate on several input
cases (a failing config is `incorrect` and never timed), then timing (warm-up, L2 flushed, rotated input sets,
interleaved candidates, median with spread; a candidate past its give-up threshold is `pruned`), in a child
process with a time limit (one child kept for a whole run; a segfault, CUDA fault or hang costs only that
step). experiment.py's candidates run under the guardrails (static rules on its source, a trap for other
attention implementations and side streams, output-reuse and lazy-output checks; a violation is status
`guard`), and a run refuses to start when prepare.py or a file of fa4tune/harness/ differs from its pinned hash.

This file is the contract: the settings every run is measured with, the run (`run_experiment`: the table, the
metric lines, one results.tsv row) and the command line. The engine behind it is the package fa4tune/harness/,
one module per job (its __init__ has the map): settings, candidates, steps (gate then timing), step_server and
isolation (the child processes), evaluation (one config: the search's entry), runs, gate, timing, guards and
runtime_guards, metrics, results_tsv, baselines, self_check.

    uv run python experiment.py > run.log          # experiment.py's dispatch table (calls run_experiment)
    uv run python prepare.py --baseline            # upstream SM120 defaults vs FA4's own path vs torch SDPA
    uv run python prepare.py --self-check          # the gate catches unwritten and wrong outputs on this GPU

Every line says `target=sm120 device=<name> mode=native|emulated`: on a GPU that is not SM 12.0 the SM120
kernels run emulated (upstream's SM120 classes compiled for the local GPU) and the rates are that GPU's.
"""

from __future__ import annotations

import os
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

# ------------------------------------------------------------------------------------------------
# The harness's fixed settings. Their values are in fa4tune/harness/settings.py, the one place the engine
# (in this process and in its child processes) reads them too.
# ------------------------------------------------------------------------------------------------
from fa4tune.harness.settings import (  # noqa: F401  (what every run is measured with, named here for the reader)
    DEFAULT_SUITE,  # the suite a run measures unless --suite says otherwise
    EXPERIMENT_PATH,  # experiment.py, whose dispatch table and kernels run
    RESULTS_TSV,  # where a run appends its row ($FA4TUNE_RESULTS_TSV, else results.tsv at the root)
    STEP_TIME_LIMIT_S,  # seconds per (problem, direction) in a child: compile, gate and timing (--time-limit)
    STARTUP_TIME_LIMIT_S,  # seconds for a child's imports (torch, the CuTe DSL) before its first step
    WARMUP_CALLS,  # untimed calls per candidate first (the first one compiles)
    TIMED_ROUNDS,  # rounds of interleaved timed calls; each round calls every input set once
    INPUT_SETS,  # random input sets rotated between timed calls
    GATE_SCALE,  # a gate case: inputs multiplied by this (large magnitudes)
    GATE_SEQLEN_OFFSET,  # a gate case: sequence lengths that are not tile multiples
    GATE_RANDOM_PROBLEMS,  # gate cases: small problems of the same class drawn at run time (seed recorded)
    GATE_RANDOM_MAX_SEQLEN,  # ... and their longest sequence
    Settings,  # the numbers of a step as one record (smaller ones in tests)
)

# ------------------------------------------------------------------------------------------------
# Command line (main() is at the end): parsed before the imports below, which take seconds (torch), so that
# --help and bad arguments answer at once.
# ------------------------------------------------------------------------------------------------

from fa4tune.command_line import CommandParser, positive_seconds  # noqa: E402


def _parser() -> CommandParser:
    """prepare.py's options (one `error:` line and exit 2 for a bad one)."""
    parser = CommandParser(
        prog="prepare.py",
        description="The fixed benchmark harness: correctness gate, timing, metric lines, results.tsv. "
        "Tuned configs run through experiment.py (`python experiment.py > run.log`).",
    )
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--baseline", action="store_true", help="time upstream's SM120 defaults, FA4's own path for this GPU and torch SDPA")
    action.add_argument("--experiment", metavar="PATH", help="run the dispatch table of an experiment file (as `python experiment.py` does)")
    action.add_argument("--self-check", action="store_true", help="show the gate catches planted faults on this GPU, and the timer's spread")
    parser.add_argument("--suite", default=DEFAULT_SUITE, help=f"suite name (suites/*.json) or path to a suite file (default: {DEFAULT_SUITE})")
    parser.add_argument("--only", metavar="TEXT", help="only the problems whose name contains TEXT")
    parser.add_argument("--time-limit", type=positive_seconds, default=STEP_TIME_LIMIT_S, help=f"seconds per step before a child is killed (default: {STEP_TIME_LIMIT_S:g})")
    parser.add_argument("--description", default="", help="free text for the results.tsv row (--experiment)")
    return parser


if __name__ == "__main__":
    _early = _parser().parse_args()  # exits here for --help and bad arguments; main() parses again
    from fa4tune.config import ConfigError
    from fa4tune.suites import load_suite

    try:  # a bad suite or experiment path is one line now, not after the imports below
        load_suite(_early.suite)
    except ConfigError as _error:
        print(f"error: {_error}", file=sys.stderr)
        sys.exit(2)
    if _early.experiment and not Path(_early.experiment).is_file():
        print(f"error: experiment_file: {_early.experiment!r} does not exist", file=sys.stderr)
        sys.exit(2)

from fa4tune.config import ConfigError, Problem  # noqa: E402
from fa4tune.harness import baselines, candidates, evaluation, gpu, guards, metrics, results_tsv, runs, self_check  # noqa: E402
from fa4tune.harness.measurement import ProblemResult  # noqa: E402
from fa4tune.targets import Target  # noqa: E402

# ------------------------------------------------------------------------------------------------
# The run: experiment.py's dispatch table over a suite.
# ------------------------------------------------------------------------------------------------


def plan_experiment(experiment_module, problems: Sequence[Problem], target: Target, experiment_path: str | Path) -> runs.Plan:
    """The dispatch table's configs on every problem and direction; infeasible ones are decided here."""
    plan = runs.Plan([], [], [])
    for direction, index, problem in runs.directions(problems):
        pc = problem.problem_class
        fwd_config, bwd_config = evaluation.table_forward_config(experiment_module, problem), experiment_module.backward_config(pc)
        own = fwd_config if direction == "fwd" else bwd_config
        planned = runs.Planned(candidates.EXPERIMENT, direction, index, problem, own.to_dict())
        failure = evaluation.feasibility_failure(direction, fwd_config, bwd_config, problem, target)
        if failure:
            planned.result = ProblemResult(problem.label, direction, "infeasible", reason=failure)
        else:
            plan.add_step(direction, index, problem, [candidates.experiment_spec(candidates.EXPERIMENT, experiment_path, fwd_config, bwd_config)])
        plan.planned.append(planned)
    return plan


def run_experiment(experiment_module, suite: str = DEFAULT_SUITE, *, description: str = "", proposer: str | None = None,
                   results_path: str | Path = RESULTS_TSV, only: str | None = None, timeout_s: float = STEP_TIME_LIMIT_S,
                   context: runs.RunContext | None = None, device: str = "cuda", settings: Settings | None = None) -> int:
    """Run experiment_module's dispatch table over a suite: table, metric lines, one results.tsv row.

    Returns 0 when every config passed, 1 when some did not, 2 for bad input or a broken guardrail (one
    line each on stderr). `context`, `device` and `settings` default to this GPU and the settings above."""
    changed = guards.harness_changes()
    refusals = [str(v) for v in guards.check_module(experiment_module)]
    refusals += [guards.harness_edit_error(changed)] if changed and not guards.harness_edit_allowed() else []
    for line in refusals:
        runs.error(line)
    if refusals:
        return 2
    if changed:
        description = f"{guards.harness_edit_mark(changed)} {description}".rstrip()
    try:
        problems, context, settings, clocks_start = runs.begin(suite, only, context, settings, device)
    except ConfigError as err:
        runs.error(str(err))
        return 2
    plan = plan_experiment(experiment_module, problems, context.target, Path(experiment_module.__file__).resolve())
    runs.report_planned_failures(plan, context)
    env = gpu.kernel_env(context.device, context.target, context.mode)
    plan.fill(evaluation.run_steps_isolated(plan.steps, settings, env=env, timeout_s=timeout_s, device=device, on_result=runs.progress(context)))
    measurements = plan.measurements(context).get(candidates.EXPERIMENT, [])
    runs.print_clocks(clocks_start, context)
    summary = metrics.summarize(measurements, context.target, context.device.name, context.mode)
    metrics.print_table(metrics.problem_table(measurements, f"experiment.py per problem [{context.label}]"))
    for line in metrics.metric_lines(summary):
        print(line, flush=True)
    statuses = sorted({m.status for m in measurements if not m.ok})
    configs = {"fwd": {}, "bwd": {}}
    for m in measurements:
        configs[m.kind][m.problem_class] = m.config
    row = results_tsv.ResultRow(
        timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"), commit=runs.git_commit(),
        proposer=proposer or os.environ.get("FA4TUNE_PROPOSER", "manual"), target=context.target.name,
        device=context.device.name, mode=context.mode,
        fwd_tflops_geomean=summary.fwd_tflops_geomean, bwd_tflops_geomean=summary.bwd_tflops_geomean,
        fwd_tflops_peak=summary.fwd_tflops_peak, bwd_tflops_peak=summary.bwd_tflops_peak,
        peak_vram_mb=summary.peak_vram_mb, configs_ok=f"{summary.configs_ok}/{summary.configs_total}",
        status="ok" if not statuses else ",".join(statuses), prepare_sha256=runs.prepare_sha256(), description=description,
        config={"suite": suite, "gate_seed": settings.gate_seed, "forward": configs["fwd"], "backward": configs["bwd"],
                "fwd_spread_pct": summary.fwd_spread_pct, "bwd_spread_pct": summary.bwd_spread_pct,  # (no new columns)
                "problems": metrics.problem_timings(measurements),  # what fa4tune.keep decides on, per problem
                **({"harness_edited": changed} if changed else {})},
    )
    results_tsv.append_row(results_path, row)
    return 0 if not statuses else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (2 for bad input, with one line on stderr)."""
    args = _parser().parse_args(argv)
    if args.baseline:
        return baselines.run_baseline(args.suite, only=args.only, timeout_s=args.time_limit)
    if args.self_check:
        return self_check.run_self_check()
    path = Path(args.experiment)
    if not path.is_file():
        runs.error(f"experiment_file: {str(path)!r} does not exist")
        return 2
    try:
        experiment_module = candidates.load_experiment(path)  # the static rules and the pin first (guards.admit)
    except guards.Refused as refused:
        for line in refused.lines:
            runs.error(line)
        return 2
    return run_experiment(experiment_module, args.suite, description=args.description, only=args.only, timeout_s=args.time_limit)


if __name__ == "__main__":
    sys.exit(main())
