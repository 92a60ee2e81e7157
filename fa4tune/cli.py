"""Command lines: the parser every command uses, and experiment.py's (static sm_120a check without a GPU,
prepare.py's run with one: `prepare.py --experiment`, run as a script in this process).

Every refusal is one `error:` line on stderr and exit code 2: bad arguments (CommandParser), a guard violation,
and a dispatch-table entry that names an unknown knob, is keyed by no problem class or breaks a static rule.
experiment.py hands over its command line before its own imports (torch, the CuTe DSL: seconds), so `--help`
and bad arguments answer at once; the file is then checked, imported as module `experiment` and run.
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback
from pathlib import Path

from fa4tune.config import BackwardConfig, ConfigError, ForwardConfig, ProblemClass
from fa4tune.command_line import CommandParser, count, positive_seconds  # noqa: F401  (the parser every command uses)

PREPARE_PATH = Path(__file__).resolve().parent.parent / "prepare.py"
DISPATCH_TABLES = (("FORWARD_DISPATCH", "fwd", ForwardConfig), ("BACKWARD_DISPATCH", "bwd", BackwardConfig))


def _parser() -> CommandParser:
    parser = CommandParser(
        prog="experiment.py",
        description="Run experiment.py's dispatch table: on a GPU through prepare.py (correctness gate, timing, "
        "metric lines, results.tsv); without one (or with --static) as a static sm_120a compile report.",
    )
    parser.add_argument("--static", action="store_true", help="compile for sm_120a and read cubins even if a GPU is present")
    parser.add_argument("--suite", default="standard", help="suite name (suites/*.json) or path to a suite file (default: standard)")
    parser.add_argument("--target", default=None, help="target rules to check against (default: sm120)")
    parser.add_argument("--jobs", type=count, default=None, help="parallel compile processes (default: number of CPUs)")
    parser.add_argument("--timeout", type=positive_seconds, default=300.0, help="seconds before a compile is killed (default: 300)")
    parser.add_argument("--no-cache", action="store_true", help="ignore and do not write the static-facts cache")
    parser.add_argument("--description", default="", help="free text stored in results.tsv (GPU runs)")
    return parser


def experiment_main(path: str | Path, argv: list[str] | None = None) -> int:
    """Entry point of `python experiment.py` (the file at `path`); returns the exit code (2 for bad input)."""
    args = _parser().parse_args(argv)
    # --suite and --target before experiment.py is imported (it imports torch and the CuTe DSL: 13-30 s), so that a
    # typo is one line at once (--jobs and --timeout are checked by the parser)
    from fa4tune.suites import load_suite
    from fa4tune.targets import get_target

    try:
        get_target(args.target)
        load_suite(args.suite)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from fa4tune.harness import guards

    path = Path(path)
    refusals = [str(v) for v in guards.check_source(path)]  # before the file runs (program.md's guardrails)
    if not refusals:
        try:
            module = _import_experiment(path)
            from fa4tune.targets import get_target

            refusals = [str(v) for v in guards.check_kernel_classes(module)] + dispatch_refusals(module, get_target(args.target))
        except ConfigError as err:
            refusals = [str(err)]
        except guards.Refused as refused:  # (the pin: load_experiment admits the file first)
            refusals = refused.lines
    for line in refusals:
        print(f"error: {line}", file=sys.stderr)
    if refusals:
        return 2
    # fa4tune.kernel_class finds experiment.py's kernel classes in the module loaded as `experiment`; run as a
    # script, this module is that one
    sys.modules.setdefault("experiment", module)
    try:
        for line in fallback_lines(module, load_suite(args.suite)):
            print(line, flush=True)
        if args.static or not _gpu_available():
            return static_main(module, args)
        return run_prepare(["--experiment", str(path), "--suite", args.suite, "--description", args.description])
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def fallback_lines(module, problems) -> list[str]:
    """One line per problem class of the suite (and direction it runs) that runs another class's entry under the
    fallback rule (fa4tune.fallback), or ours for wide heads, read from experiment.py's TABLES; none where the file
    has no DispatchTables."""
    from fa4tune.api import DispatchTables
    from fa4tune.suites import problem_classes

    tables = getattr(module, "TABLES", None)
    if not isinstance(tables, DispatchTables):
        return []
    lines = []
    for pc in problem_classes(problems):
        backward = any(p.backward and p.problem_class == pc for p in problems)
        for direction in ("fwd", "bwd") if backward else ("fwd",):
            found = tables.resolution(direction, pc)
            if found.rule in ("fallback", "wide"):
                lines.append(f"{found.rule} {direction}: {found.describe()}")
    return lines


def _import_experiment(path: Path):
    """The experiment file imported as module `experiment`; a ConfigError raised by its top level (a dispatch
    entry with an unknown knob) names the line."""
    from fa4tune.harness.candidates import load_experiment

    try:
        return load_experiment(path)
    except ConfigError as err:
        lines = [frame.lineno for frame in traceback.extract_tb(err.__traceback__) if Path(frame.filename).resolve() == path.resolve()]
        if not lines:
            raise
        raise ConfigError(err.rule, f"{str(err).split(': ', 1)[1]} ({path.name}:{lines[-1]})") from err


def run_prepare(argv: list[str]) -> int:
    """`python prepare.py ARGV` run in this process, as a script (its imports and the experiment module loaded
    here are reused); its exit code."""
    saved = sys.argv
    sys.argv = [str(PREPARE_PATH), *argv]
    try:
        runpy.run_path(str(PREPARE_PATH), run_name="__main__")
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else 0 if done.code is None else 1
    finally:
        sys.argv = saved
    return 0


def dispatch_refusals(module, target) -> list[str]:
    """One line per dispatch-table entry that can never run: its key is not a problem class name as the dispatch
    looks it up, its value is not a config of its direction, or the config breaks a static rule of the target."""
    from fa4tune.static_check import StaticJob, verdict

    refusals = []
    for table, kind, config_type in DISPATCH_TABLES:
        for key, config in getattr(module, table, {}).items():
            entry = f"{table}[{key!r}]"
            try:
                pc = ProblemClass.parse(key)
            except ConfigError as err:
                refusals.append(f"{entry}: {err}")
                continue
            if pc.name != key:
                refusals.append(f"{entry}: problem_class_name: the dispatch looks this class up as {pc.name!r}, so the entry is never used")
            elif not isinstance(config, config_type):
                refusals.append(f"{entry}: dispatch_entry: must be a {config_type.__name__}, got {type(config).__name__}")
            else:
                check = verdict(StaticJob(kind, config, pc), target)
                if not check:
                    refusals.append(f"{entry}: infeasible on {target.name}: {check}")
    return refusals


def _gpu_available() -> bool:
    import torch

    return torch.cuda.is_available()


def static_jobs(module, problems) -> list:
    """One forward job per problem class of the suite (and one for its packed problems' varlen entry where that
    differs), and one backward job where a problem needs it."""
    from fa4tune.static_check import StaticJob
    from fa4tune.suites import problem_classes

    jobs = []
    for pc in problem_classes(problems):
        forwards = [module.forward_config(pc)] if any(not p.lengths and p.problem_class == pc for p in problems) else []
        if any(p.lengths and p.problem_class == pc for p in problems):
            forwards.append(getattr(module, "varlen_forward_config", module.forward_config)(pc))
        jobs += [StaticJob("fwd", config, pc) for config in dict.fromkeys(forwards)]
        if any(p.backward and p.problem_class == pc for p in problems):
            jobs.append(StaticJob("bwd", module.backward_config(pc), pc))
    return jobs


def static_main(module, args) -> int:
    """Compile the dispatch table for the target, print a table and the static_* metric lines; one `error:` line
    per kernel that is not ok (exit code 1, as a GPU run's failed problems)."""
    from fa4tune.static_check import DEFAULT_CACHE, run_static
    from fa4tune.static_report import print_report
    from fa4tune.suites import load_suite
    from fa4tune.targets import get_target

    target = get_target(args.target)
    problems = load_suite(args.suite)
    jobs = static_jobs(module, problems)
    print(f"static check: {len(jobs)} kernels for {target.description}, compiled for {target.cute_arch} with fake tensors", flush=True)
    facts = run_static(
        jobs, target, experiment_path=Path(module.__file__), workers=args.jobs or os.cpu_count(),
        timeout_s=args.timeout, cache_path=None if args.no_cache else DEFAULT_CACHE,
    )
    print_report(jobs, facts, target)
    for job, f in zip(jobs, facts):
        if not f.ok:
            print(f"error: static {job.kind} {job.problem_class.name}: {f.status}: {f.reason} [target={target.name} mode=static]", file=sys.stderr)
    return 0 if all(f.ok for f in facts) else 1
