"""CPU probe (no GPU): how often TPE proposes a config the static rules refuse, on causal backward spaces.

Each run asks a sampler N times on an in-memory study of one backward problem class (sm120), its space cut to the
class (StudySpec.space, as a run searches it), and tells each trial as search.running.loop does: an infeasible config
gets trial.set_constraint("feasibility", Space.violation) and is told PRUNED without a value (loop.told); a feasible
one gets constraint 0 and a SYNTHETIC value (a deterministic function of the config, not a measurement), a config
proposed again is told its earlier value (the loop's copy). No baseline, transfer or explore trials: the sampler alone.

Variants:
  tpe            make_sampler's TPE before the change (multivariate, 8 startup trials, constant liar)
  tpe+cfunc      the same with constraints_func reading the stored feasibility constraint
  tpe-complete0  infeasible trials told COMPLETE with value 0 and no constraint (the convention before PRUNED)
  random         Optuna's RandomSampler
  tpe-feasible   search.proposing.samplers.make_sampler("tpe", seed, spec): FeasibleTPESampler (the change)
  random-feasible  uniform over the class's feasible configs (FeasibleTPESampler that never leaves its startup)
"fallback" counts the model-based asks where FeasibleTPESampler's TRIES proposals were all refused and it drew a
random feasible config instead; "to 99%" the asks until a feasible config within 1 % of the space's best (synthetic).

Usage: PYTHONPATH=. uv run python docs/measurements/data/2026-12-06-tpe-constraints-probe.py [N_ASKS] [SEEDS] [VARIANTS]
       ... 2026-12-06-tpe-constraints-probe.py fwd-bench [SEEDS]: the forward search bench (search.running.bench.one_run
       on search/data/h200_sweep.json, every class), make_sampler("tpe") with the spec (the change) and without it
"""

from __future__ import annotations

import hashlib
import statistics
import sys
import time
import warnings

import optuna
from optuna.trial import TrialState

from fa4tune.config import ProblemClass
from fa4tune.suites import load_suite
from fa4tune.targets import get_target
from search.proposing.samplers import FeasibleTPESampler, make_sampler
from search.running.loop import told
from search.storing import schema
from search.storing.history import config_key
from search.storing.study import StudySpec

CLASSES = ("d128-causal-gqa4-bf16", "d96-causal-bf16", "d64-causal-bf16")
TARGET = get_target("sm120")


def spec_of(name: str) -> StudySpec:
    pc = ProblemClass.parse(name)
    return StudySpec("bwd", pc, tuple(p for p in load_suite("standard") if p.problem_class == pc and p.backward), TARGET)


def synthetic(space, config, pc) -> float:
    """Invented TFLOPS: more shared memory and 256 threads help, a custom class a little, +-5 % noise."""
    d = space.values(config)
    noise = int.from_bytes(hashlib.sha256(repr(config_key(d)).encode()).digest()[:4], "little") / 2**32 - 0.5
    smem = space.smem_bytes(config, pc)[0] / TARGET.smem_per_block
    return 100.0 * (1 + 0.4 * smem) * (1.15 if d.get("num_threads") == 256 else 1.0) \
        * (1.05 if d.get("kernel", "sm120") != "sm120" else 1.0) * (1 + 0.1 * noise)


def sampler_of(variant: str, seed: int, spec):
    if variant == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=8, constant_liar=True)
    if variant == "tpe+cfunc":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=8, constant_liar=True,
                                          constraints_func=lambda t: [t.constraints.get(schema.CONSTRAINT_KEY, 0.0)])
    if variant == "tpe-complete0":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=8, constant_liar=True)
    if variant == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if variant == "tpe-feasible":
        return _counting(make_sampler("tpe", seed, spec))
    if variant == "random-feasible":
        return FeasibleTPESampler(spec, seed=seed, multivariate=True, n_startup_trials=10**9, constant_liar=True)
    raise ValueError(variant)


def _counting(sampler):
    """Counts the fallbacks after the startup trials (the sampler's random feasible draw in place of TPE's)."""
    sampler.fallbacks = 0
    if isinstance(sampler, FeasibleTPESampler):
        draw = sampler._random_feasible

        def counted(search_space):
            sampler.fallbacks += sampler.in_model
            return draw(search_space)

        sampler._random_feasible = counted
        inner = sampler._sample_relative

        def relative(study, trial, search_space):
            finished = study._get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED), use_cache=False)
            sampler.in_model = len(finished) >= sampler._n_startup_trials
            return inner(study, trial, search_space)

        sampler._sample_relative = relative
    return sampler


def one_run(variant: str, spec, seed: int, n: int) -> dict:
    space, pc = spec.space, spec.problem_class
    study = optuna.create_study(sampler=sampler_of(variant, seed, spec), direction="maximize")
    distributions = space.distributions()
    seen: dict = {}
    refused, ask_s, reached = 0, 0.0, None
    best = max(synthetic(space, c, pc) for c in space.feasible(pc, spec.target))
    for i in range(n):
        t0 = time.perf_counter()
        trial = study.ask(distributions)
        ask_s += time.perf_counter() - t0
        config = space.config(trial.params)
        verdict = space.check(config, pc, spec.target)
        if not verdict:
            refused += 1
            violation = space.violation(config, pc, spec.target, verdict)
            value = 0.0
        else:
            violation = 0.0
            value = seen.setdefault(config_key(config.to_dict()), synthetic(space, config, pc))
            if reached is None and value >= 0.99 * best:
                reached = i + 1
        if variant == "tpe-complete0":
            study.tell(trial, value, state=TrialState.COMPLETE)
            continue
        trial.set_constraint(schema.CONSTRAINT_KEY, violation)
        state, told_value = told(TrialState.COMPLETE, value, violation)
        study.tell(trial, told_value, state=state)
    return {"refused": refused / n, "distinct": len(seen), "best": max(seen.values(), default=0.0) / best,
            "reached": reached or float("inf"), "fallback": getattr(study.sampler, "fallbacks", 0), "ask_ms": 1e3 * ask_s / n}


def median_reached(runs, n) -> str:
    m = statistics.median(r["reached"] for r in runs)
    return f">{n}" if m == float("inf") else f"{m:g}"


def forward_bench(seeds: int) -> None:
    import search.running.bench as bench
    from search.evaluating.table import load_table

    table = load_table(bench.DEFAULT_TABLE)
    classes = bench.classes_of(table, "fwd")
    print(f"forward bench, {bench.DEFAULT_TABLE}, classes {', '.join(classes)}, seeds 0..{seeds - 1}")
    for strategy in ("tpe", "default"):
        for label, make in (("FeasibleTPESampler", make_sampler), ("TPESampler", lambda name, seed=None, spec=None: make_sampler(name, seed))):
            bench.make_sampler = make
            runs = [bench.one_run(table, strategy, "fwd", c, seed, 0.99) for c in classes for seed in range(seeds)]
            need = [r.needed if r.needed is not None else float("inf") for r in runs]
            q = statistics.quantiles(need, n=4, method="inclusive")
            print(f"| {strategy} | {label} | {statistics.median(need):g} [{q[0]:g}-{q[2]:g}] | {sum(r.needed is None for r in runs)} "
                  f"| {statistics.median(r.trials for r in runs):g} |", flush=True)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "fwd-bench":
        return forward_bench(int(sys.argv[2]) if len(sys.argv) > 2 else 10)
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    seeds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    variants = sys.argv[3].split(",") if len(sys.argv) > 3 else ["tpe", "tpe+cfunc", "tpe-complete0", "random", "tpe-feasible", "random-feasible"]
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.simplefilter("ignore")
    print(f"{n} asks, seeds 0..{seeds - 1}; mean over seeds [min-max]")
    print("| class | sampler | refused fraction | distinct feasible configs | best / space best | asks to 99% (median) | fallbacks | ask ms |")
    print("|---|---|---|---|---|---|---|---|")
    for name in CLASSES:
        spec = spec_of(name)
        spec.space.feasible(spec.problem_class, spec.target)  # enumerate once, outside the timings
        for variant in variants:
            runs = [one_run(variant, spec, seed, n) for seed in range(seeds)]

            def cell(key, fmt):
                xs = [r[key] for r in runs]
                return f"{fmt(statistics.mean(xs))} [{fmt(min(xs))}-{fmt(max(xs))}]"

            print(f"| {name} | {variant} | {cell('refused', lambda x: f'{x:.2f}')} | {cell('distinct', lambda x: f'{x:.1f}')} "
                  f"| {cell('best', lambda x: f'{x:.3f}')} | {median_reached(runs, n)} | {statistics.mean(r['fallback'] for r in runs):.1f} "
                  f"| {statistics.mean(r['ask_ms'] for r in runs):.0f} |", flush=True)


if __name__ == "__main__":
    main()
