"""The backward census on the CPU: compile for sm_120a what fa4tune.census samples, per problem class, and check
the backward rules against the compiles (fa4tune/census.py says what is sampled and why).

    uv run python bench/bwd_census.py [--out search/data/bwd_census.jsonl] [--classes NAME ...] [--jobs N]
    uv run python bench/bwd_census.py --summary        # the census as a markdown table, and its contradictions

Each compile is appended to --out as it finishes; configs already there are skipped, so a census resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fa4tune.census import census_sample, classify, conservative, contradictions, entry, read_jsonl, summary_rows  # noqa: E402
from fa4tune.config import BackwardConfig, ProblemClass  # noqa: E402
from fa4tune.feasibility import check_backward  # noqa: E402
from fa4tune.suites import load_suite, problem_classes  # noqa: E402
from fa4tune.targets import get_target  # noqa: E402

DEFAULT_OUT = ROOT / "search" / "data" / "bwd_census.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--suite", default="standard")
    parser.add_argument("--classes", nargs="*", help="problem class names (default: every backward class of the suite)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--variants", type=int, default=6, help="accepted configs drawn at random besides one per structure")
    parser.add_argument("--per-rule", type=int, default=2, help="configs per rule that the rule alone rejects")
    parser.add_argument("--samples", nargs="*", default=["structural", "variant", "rejected", "gate"])
    parser.add_argument("--summary", action="store_true", help="print the census, compile nothing")
    args = parser.parse_args()

    target = get_target("sm120")
    names = args.classes or [pc.name for pc in problem_classes([p for p in load_suite(args.suite) if p.backward])]
    entries = read_jsonl(args.out)
    if args.summary:
        for name in names:
            print(json.dumps(summary_rows(classify(ProblemClass.parse(name), target), entries)))
        problems = contradictions(entries, target)
        print(f"{len(entries)} compiles, {len(problems)} contradictions; rejected by a compile rule yet compiled: {dict(conservative(entries))}")
        for line in problems:
            print("  " + line)
        raise SystemExit(1 if problems else 0)

    from fa4tune.static_check import StaticChecker, StaticJob

    done = {(e["problem_class"], BackwardConfig.from_dict(e["config"]).key()) for e in entries}
    jobs, samples = [], {}
    for name in names:
        pc = ProblemClass.parse(name)
        for sample, cfg in census_sample(classify(pc, target), args.variants, args.per_rule):
            if sample in args.samples and (name, cfg.key()) not in done:
                job = StaticJob("bwd", cfg, pc)
                jobs.append(job)
                samples[id(job)] = sample
    print(f"{len(jobs)} compiles for {', '.join(names)} ({len(entries)} already in {args.out})", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    start, count = time.monotonic(), [0]

    def on_result(job, facts):
        count[0] += 1
        line = entry(samples[id(job)], job.problem_class, job.config, check_backward(job.config, job.problem_class, target), facts)
        with open(args.out, "a") as f:
            f.write(json.dumps(line) + "\n")
        print(f"{count[0]:5d} {time.monotonic() - start:7.0f}s {line['sample']:10s} {line['verdict']:28s} {facts.status:14s} "
              f"{job.problem_class.name} {job.config.short()}", flush=True)

    with StaticChecker(target, ROOT / "experiment.py", args.jobs) as checker:
        checker.check(jobs, on_result, rules=False)


if __name__ == "__main__":
    main()
