"""Command line of experiment.py: static sm_120a check without a GPU, harness run with one."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from fa4tune.config import ConfigError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="experiment.py",
        description="Run experiment.py's dispatch table: on a GPU through prepare.py (correctness gate, timing, "
        "metric lines, results.tsv); without one (or with --static) as a static sm_120a compile report.",
    )
    parser.add_argument("--static", action="store_true", help="compile for sm_120a and read cubins even if a GPU is present")
    parser.add_argument("--suite", default="standard", help="suite name (suites/*.json) or path to a suite file (default: standard)")
    parser.add_argument("--target", default=None, help="target rules to check against (default: sm120)")
    parser.add_argument("--jobs", type=int, default=None, help="parallel compile processes (default: number of CPUs)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before a compile is killed (default: 300)")
    parser.add_argument("--no-cache", action="store_true", help="ignore and do not write the static-facts cache")
    parser.add_argument("--description", default="", help="free text stored in results.tsv (GPU runs)")
    return parser


def experiment_main(module, argv: list[str] | None = None) -> int:
    """Entry point of `python experiment.py`; returns the exit code (2 for bad input)."""
    args = _parser().parse_args(argv)
    from fa4tune import guards

    violations = guards.check_module(module)
    for violation in violations:  # before any compile or GPU work (program.md's guardrails)
        print(f"error: {violation}", file=sys.stderr)
    if violations:
        return 2
    # fa4tune.kernel_class finds experiment.py's kernel classes in the module loaded as `experiment`; run as a
    # script, this module is that one
    sys.modules.setdefault("experiment", module)
    try:
        if args.static or not _gpu_available():
            return static_main(module, args)
        import prepare

        return prepare.run_experiment(module, suite=args.suite, description=args.description)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def _gpu_available() -> bool:
    import torch

    return torch.cuda.is_available()


def static_jobs(module, problems) -> list:
    """One forward job per problem class of the suite, and one backward job where a problem needs it."""
    from fa4tune.static_check import StaticJob
    from fa4tune.suites import problem_classes

    jobs = []
    for pc in problem_classes(problems):
        jobs.append(StaticJob("fwd", module.forward_config(pc), pc))
        if any(p.backward and p.problem_class == pc for p in problems):
            jobs.append(StaticJob("bwd", module.backward_config(pc), pc))
    return jobs


def static_main(module, args) -> int:
    """Compile the dispatch table for the target, print a table and the static_* metric lines."""
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
    return 0 if all(f.ok for f in facts) else 1
