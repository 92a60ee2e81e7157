"""Backward sweep on a GPU through the evaluation engine: the feasible backward configs of each problem class, gated
and timed by `search run`'s evaluator (search.evaluating.protocol.make_evaluator("gpu"): compile-ahead, one step
server), on one representative problem per class.

    python3 bench/bwd_sweep.py --out DIR [--classes NAME ...] [--kernel NAME [--opened]] [--per-class N] [--time-budget S]
    python3 bench/bwd_sweep.py --out DIR --merge TABLE     # add DIR's measurements to a replay table (JSON)

Upstream's default comes first in each class, then the accepted configs in a seeded random order (N per class at
most; 0: all), the classes taken in turn, so a run cut by --time-budget covers every class alike. Each measurement
is appended to DIR/bwd-sweep.jsonl as it finishes, and configs already there are skipped: a sweep resumes.
`--kernel` sweeps another backward class's accepted configs (upstream's default still first, the baseline), e.g. a
class of experiment.py that is not searched yet; `--opened`, only those upstream's class refuses.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from itertools import zip_longest
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fa4tune import defaults  # noqa: E402
from fa4tune.census import read_jsonl  # noqa: E402
from fa4tune.config import BackwardConfig, ProblemClass  # noqa: E402
from fa4tune.feasibility import check_backward  # noqa: E402
from fa4tune.space import feasible_backward  # noqa: E402
from fa4tune.suites import load_suite, problem_classes  # noqa: E402
from fa4tune.targets import get_target  # noqa: E402

SWEEP_FILE = "bwd-sweep.jsonl"
DEFAULT_CLASSES = ("d128-causal-bf16", "d128-noncausal-bf16", "d64-causal-bf16", "d128-causal-gqa4-bf16")


def representative(name: str, suite: str = "standard"):
    """The first problem of the class with a backward in the suite."""
    return next(p for p in load_suite(suite) if p.backward and p.problem_class.name == name)


def read_measurements(out: Path) -> list[dict]:
    return read_jsonl(out / SWEEP_FILE)


def sweep_order(classes: list[str], per_class: int, seed: int, done: set, kernel: str = "sm120",
                opened: bool = False) -> list[tuple[ProblemClass, BackwardConfig]]:
    """(class, config) pairs to measure: per class upstream's default, then the kernel class's accepted configs at
    random (`opened`: only those upstream's class refuses); classes in turn."""
    target, lanes = get_target("sm120"), []
    for name in classes:
        pc = ProblemClass.parse(name)
        configs = list(feasible_backward(pc, target, kernel))
        if opened:
            configs = [c for c in configs if not check_backward(dataclasses.replace(c, kernel="sm120"), pc, target)]
        random.Random(f"{seed}-{name}").shuffle(configs)
        default = defaults.upstream_backward(pc)
        configs = [default] + [c for c in configs if c != default]
        if per_class:
            configs = configs[:per_class]
        lanes.append([(pc, c) for c in configs if (name, c.key()) not in done])
    return [item for group in zip_longest(*lanes) for item in group if item is not None]


def merge(out: Path, table_path: Path) -> None:
    """Adds DIR's backward measurements to the table (a later one of the same key replaces an earlier one)."""
    table = json.loads(table_path.read_text())
    kept = [m for m in table["measurements"] if m.get("kind") != "bwd"]
    new = {(m["problem_class"], BackwardConfig.from_dict(m["config"]).key()): m for m in read_measurements(out)}
    table["measurements"] = kept + list(new.values())
    problems = {p["name"]: p for p in table.get("problems", [])}
    for m in new.values():
        p = representative(m["problem_class"])
        problems.setdefault(p.name, p.to_dict())
    table["problems"] = list(problems.values())
    table_path.write_text(json.dumps(table, indent=1) + "\n")
    print(f"{table_path}: {len(kept)} other measurements kept, {len(new)} backward measurements")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--classes", nargs="*", default=list(DEFAULT_CLASSES))
    parser.add_argument("--per-class", type=int, default=0, help="configs per class at most (0: every accepted one)")
    parser.add_argument("--kernel", default="sm120", help="the backward kernel class swept (default upstream's, sm120)")
    parser.add_argument("--opened", action="store_true", help="with --kernel: only the configs upstream's class refuses")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-budget", type=float, default=0, help="seconds after which no new config starts (0: none)")
    parser.add_argument("--compile-jobs", type=int, default=-1, help="compile processes (-1: every core but one)")
    parser.add_argument("--merge", type=Path, help="add DIR's measurements to this replay table and stop")
    args = parser.parse_args()
    if args.opened and args.kernel == "sm120":
        parser.error("--opened: sweeps the configs another class adds to upstream's; name it with --kernel")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.merge:
        merge(args.out, args.merge)
        return
    known = {pc.name for pc in problem_classes([p for p in load_suite("standard") if p.backward])}
    unknown = [c for c in args.classes if c not in known]
    if unknown:
        raise SystemExit(f"error: problem_class: {unknown[0]!r} has no backward problem in the standard suite (one of {', '.join(sorted(known))})")

    from search.evaluating.protocol import make_evaluator

    done = {(m["problem_class"], BackwardConfig.from_dict(m["config"]).key()) for m in read_measurements(args.out)}
    todo = sweep_order(args.classes, args.per_class, args.seed, done, args.kernel, args.opened)
    problems = {name: representative(name) for name in args.classes}
    evaluator = make_evaluator("gpu", get_target("sm120"), compile_jobs=args.compile_jobs)
    print(f"{len(todo)} configs to measure ({len(done)} already in {args.out}), {evaluator.slots} in flight", flush=True)
    start, lock, count = time.monotonic(), threading.Lock(), [0]

    def one(item):
        pc, cfg = item
        if args.time_budget and time.monotonic() - start > args.time_budget:
            return
        m = evaluator.evaluate("bwd", cfg, pc, [problems[pc.name]])
        with lock:
            count[0] += 1
            with open(args.out / SWEEP_FILE, "a") as f:
                f.write(json.dumps(m.to_dict()) + "\n")
            tflops = m.geomean_tflops()
            print(f"{count[0]:5d} {time.monotonic() - start:6.0f}s {pc.name:24s} {m.status:14s} "
                  f"{(f'{tflops:6.1f}' if tflops else '     -')} {cfg.short()}  {m.reason[:100]}", flush=True)

    try:
        with ThreadPoolExecutor(evaluator.slots) as pool:
            list(pool.map(one, todo))
    finally:
        evaluator.close()
    print(f"done: {count[0]} measured in {time.monotonic() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
