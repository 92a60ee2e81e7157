"""Benchmark of the static check: seconds per (config, problem class) compile, and the whole dispatch table
with N compiler processes (cache off).

    uv run python bench/static_check.py [--suite standard] [--jobs 1 2]
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="standard")
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, os.cpu_count() or 1])
    args = parser.parse_args()

    from fa4tune.harness.candidates import load_experiment
    from fa4tune.harness.settings import EXPERIMENT_PATH as _EXPERIMENT

    experiment = load_experiment(_EXPERIMENT)  # the static rules and the pin first (guards.admit)
    from fa4tune.cli import static_jobs
    from fa4tune.static_check import run_static
    from fa4tune.suites import load_suite
    from fa4tune.targets import get_target

    target = get_target("sm120")
    jobs = static_jobs(experiment, load_suite(args.suite))
    print(f"{len(jobs)} kernels (dispatch table x problem classes of '{args.suite}'), {os.cpu_count()} CPUs")
    print(f"{'processes':>9} {'wall s':>8} {'kernels/min':>11} {'compile s median':>16} {'min':>6} {'max':>6}")
    for n in args.jobs:
        start = time.perf_counter()
        facts = run_static(jobs, target, ROOT / "experiment.py", workers=n, cache_path=None)
        wall = time.perf_counter() - start
        seconds = [f.compile_seconds for f in facts if f.ok]
        print(f"{n:>9} {wall:8.1f} {len(jobs) / wall * 60:11.1f} {statistics.median(seconds):16.2f} {min(seconds):6.2f} {max(seconds):6.2f}", flush=True)


if __name__ == "__main__":
    main()
