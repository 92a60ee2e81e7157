"""`python -m search bench`: how many evaluated configs each strategy needs to reach 99% of a table's best.

Replays a recorded table (CPU only) through the same loop a run uses, per problem class and seed, and
prints median and spread (a markdown table on stdout; a progress line per finished run on stderr). The space is the table's: the knob values it measured, under today's rules; a
config the table lacks is looked up, counted apart, and not counted as an evaluation. "turns" is the
turn-taking loop: a sampler and a scripted proposer in Claude's seat (a fixed expert ordering, not a
model) at the run's default ratio; "default" is what `search run` does without an API key: upstream's
default config first, then the best configs of the table's other problem classes (search.proposing.transfer: the
class under test left out), then the sampler.
"""

from __future__ import annotations

import statistics
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from typing import Callable

import optuna

from fa4tune.config import ProblemClass
from fa4tune.targets import get_target
from search.evaluating.replay import MISSING, ReplayEvaluator
from search.evaluating.table import ReplayTable, load_table
from search.proposing.samplers import DEFAULT_SAMPLER, make_sampler
from search.proposing.scripted import ScriptedProposer
from search.proposing.transfer import transfer_configs
from search.proposing.turns import FixedRatio, parse_ratio
from search.running.loop import LoopSettings, StopFlag, StudyLoop
from search.running.run_config import RunConfig
from search.space import Space
from search.storing.study import StudySpec

STRATEGIES = ("random", "tpe", "gp", "turns", "default")
DEFAULT_TABLE = "search/data/h200_sweep.json"


@dataclass(frozen=True)
class Run:
    """One strategy on one problem class with one seed."""

    strategy: str
    problem_class: str
    seed: int
    needed: int | None  # evaluated configs until 99% of the best; None: not within the budget
    missing: int  # evaluations the table could not answer
    trials: int  # all trials it took (infeasible proposals and duplicates included)


class _Until:
    """A silent view that stops the loop once a trial reaches the target value."""

    def __init__(self, target: float, stop: StopFlag):
        self.target, self.stop = target, stop
        self.evaluated, self.missing, self.needed = 0, 0, None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def turn(self, study, proposer):
        pass

    def message(self, text):
        pass

    def trial(self, study, r, best, done, n_trials):
        if not r.evaluated or r.confirmation_of is not None:
            return
        if r.status == MISSING:  # the table's gap, not an evaluation: the bench's space is the table
            self.missing += 1
            return
        self.evaluated += 1
        if self.needed is None and r.ok and r.value >= self.target:
            self.needed = self.evaluated
            self.stop.requested = True


def reachable_best(table: ReplayTable, space: Space, kind: str, pc: ProblemClass, target) -> float | None:
    """The table's best among the configs a search can draw: in today's domain (a table may hold configs of a kernel
    class the search does not draw, `searched = False`) and passing today's rules (a rule found after the sweep may
    exclude its best)."""
    values = []
    for m in table.measurements(kind, pc.name):
        config = space.config(m.config)
        if m.ok and not space.in_domain(config) and space.check(config, pc, target):
            values.append(m.geomean_tflops())
    return max(values) if values else None


def expert_script(table: ReplayTable, kind: str, pc: ProblemClass, target) -> list[dict]:
    """The scripted proposer's order: upstream's default, then the table's feasible configs in the search's domain by
    shared memory used, most first."""
    space = table.space(kind)
    configs = [space.config(m.config) for m in table.measurements(kind, pc.name)]
    configs = [c for c in configs if not space.in_domain(c) and space.check(c, pc, target)]
    configs.sort(key=lambda c: (-space.smem_bytes(c, pc)[0], -c.to_dict().get("num_threads", 0)))
    upstream = space.upstream(pc)
    return [upstream.to_dict()] + [c.to_dict() for c in configs if c != upstream]


def one_run(table: ReplayTable, strategy: str, kind: str, pc_name: str, seed: int, threshold: float,
            sampler: str = DEFAULT_SAMPLER) -> Run:
    """Replays one search until it reaches threshold x the table's best or runs out of budget.

    `sampler` is the sampler of the "turns" and "default" strategies (the others name their own)."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    pc = ProblemClass.parse(pc_name)
    target = get_target(table.meta.get("target") or None)
    budget = len(table.measurements(kind, pc_name))
    sampler_name = sampler if strategy in ("turns", "default") else strategy
    if sampler_name == "gp":
        import torch

        torch.set_num_threads(1)  # one run per process: GP's small matrices lose time to thread hand-offs
    space = table.space(kind)
    spec = StudySpec(kind, pc, tuple(table.problems(pc_name)), target, space)
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage(), sampler=make_sampler(sampler_name, seed, spec), direction="maximize")
    if strategy == "default":  # as `search run` does: the table's other classes' best configs after the baseline
        spec = replace(spec, transfer=tuple(transfer_configs(table, kind, pc, spec.space, target)))
    proposers, weights = [], {sampler_name: 1.0}
    if strategy == "turns":
        defaults = RunConfig()
        proposers = [ScriptedProposer(expert_script(table, kind, pc, target))]
        weights = parse_ratio(defaults.ratio, sampler_name, "scripted")
    # missing lookups count in the loop's n_trials but not here: give the loop room beyond the table
    settings = LoopSettings(n_trials=3 * budget, k=RunConfig().k, confirmations=0, baseline=strategy == "default")
    stop = StopFlag()
    view = _Until(threshold * reachable_best(table, space, kind, pc, target), stop)
    StudyLoop(study, spec, ReplayEvaluator(table), sampler_name, proposers, FixedRatio(weights), settings, view, stop).run()
    return Run(strategy, pc_name, seed, view.needed, view.missing, len(study.trials))


def _one_run_from_path(args) -> Run:
    path, strategy, kind, pc_name, seed, threshold, sampler = args
    return one_run(load_table(path), strategy, kind, pc_name, seed, threshold, sampler)


def classes_of(table: ReplayTable, kind: str = "fwd", classes: list[str] | None = None) -> list[str]:
    """The table's problem classes that have a passing config (restricted to `classes` when given)."""
    return [c for c in table.problem_classes(kind) if (not classes or c in classes) and table.best(kind, c)]


def bench(path: str, strategy: str, classes: list[str], seeds: int, threshold: float = 0.99, kind: str = "fwd", jobs: int = 1,
          sampler: str = DEFAULT_SAMPLER, progress: Callable[[int, int, Run], None] | None = None) -> list[Run]:
    """One strategy on every (problem class, seed), in that order; runs in `jobs` processes. `progress(done, total, run)`
    is called as each run finishes (in the order they finish)."""
    work = [(path, strategy, kind, c, seed, threshold, sampler) for c in classes for seed in range(seeds)]
    runs: list[Run | None] = [None] * len(work)
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            futures = {pool.submit(_one_run_from_path, args): i for i, args in enumerate(work)}
            for done, future in enumerate(as_completed(futures), 1):
                runs[futures[future]] = run = future.result()
                if progress:
                    progress(done, len(work), run)
        return runs
    table = load_table(path)
    for i, args in enumerate(work):
        runs[i] = run = one_run(table, *args[1:])
        if progress:
            progress(i + 1, len(work), run)
    return runs


def progress_line(strategy: str, done: int, total: int, run: Run, elapsed_s: float) -> str:
    """One finished run, e.g. '[bench 3/24, 12.4 s] tpe d128-causal-bf16 seed 2: 7 evaluated configs to the threshold'."""
    reached = f"{run.needed} evaluated configs to the threshold" if run.needed is not None else "threshold not reached"
    return f"[bench {done}/{total}, {elapsed_s:.1f} s] {strategy} {run.problem_class} seed {run.seed}: {reached}"


def label(strategy: str, sampler: str = DEFAULT_SAMPLER) -> str:
    """The row name: the strategies that use a sampler name it."""
    return f"{strategy} ({sampler})" if strategy in ("turns", "default") else strategy


def _summary(needed: list[int | None], budget: int) -> str:
    values = [n if n is not None else float("inf") for n in needed]
    median = statistics.median(values)
    q = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else [values[0]] * 3

    def fmt(x):
        return f">{budget}" if x == float("inf") else f"{x:g}"

    return f"{fmt(median)} [{fmt(q[0])}-{fmt(q[2])}]"


def header(table: ReplayTable, classes: list[str], seeds: int, threshold: float, kind: str = "fwd") -> str:
    """What the table measures, and the markdown header row."""
    origin = "SYNTHETIC test table, not a measurement" if table.synthetic else f"{table.meta.get('device', '?')}, mode {table.meta.get('mode', '?')}"
    budgets = ", ".join(f"{c} {len(table.measurements(kind, c))}" for c in classes)
    return "\n".join([
        f"Evaluated configs to reach {threshold:.0%} of the table's best per problem class (among configs today's rules accept; "
        f"lookups the table cannot answer are not counted): median [25th-75th percentile] over {seeds} seeds.",
        f"Table: {table.path} ({origin}); configs per class: {budgets}.",
        "",
        "| strategy | " + " | ".join(classes) + " | all classes | missing lookups | trials (median) |",
        "|---" * (len(classes) + 4) + "|",
    ])


def row(table: ReplayTable, strategy: str, runs: list[Run], kind: str = "fwd") -> str:
    """One strategy's markdown row: per class, then over all classes."""
    classes = list(dict.fromkeys(r.problem_class for r in runs))
    budgets = {c: len(table.measurements(kind, c)) for c in classes}
    cells = [_summary([r.needed for r in runs if r.problem_class == c], budgets[c]) for c in classes]
    total = _summary([r.needed for r in runs], max(budgets.values()))
    trials = statistics.median(r.trials for r in runs)
    return f"| {strategy} | " + " | ".join(cells) + f" | {total} | {sum(r.missing for r in runs)} | {trials:g} |"
