"""Transfer: a new study's first proposals after the baseline are the configs that were fastest on the *other*
problem classes of a recorded table (the shipped H200 sweep, search/data/h200_sweep.json), as in warm-starting a
hyperparameter search from a portfolio of configs that did well on related tasks. They are enqueued with proposer
`transfer` by search.storing.study.enqueue_baseline.

A config's score is its geomean TFLOPS as a share of its class's best, averaged over the classes of the same
direction that measured it and passed the gate; the study's own class never counts (a study learns nothing from a
table that already holds its answer, and the bench that measures this leaves the class out the same way). Only
configs that today's rules accept for the study's class, in the study's space, are proposed: the top
TRANSFER_CONFIGS, best first, without upstream's default (the baseline measures it anyway).
"""

from __future__ import annotations

from collections import defaultdict

TRANSFER_CONFIGS = 4


def transfer_configs(table, kind: str, problem_class, space, target, count: int = TRANSFER_CONFIGS) -> list[dict]:
    """Up to `count` config dicts for `problem_class`, best transfer score first (see the module's docstring)."""
    from search.storing.history import config_key

    shares: dict[tuple, list[float]] = defaultdict(list)
    configs: dict[tuple, object] = {}
    for other in table.problem_classes(kind):
        best = table.best(kind, other)
        if other == problem_class.name or not best:
            continue
        for m in table.measurements(kind, other):
            if not m.ok:
                continue
            config = space.config(m.config)
            key = config_key(config.to_dict())
            shares[key].append(m.geomean_tflops() / best)
            configs[key] = config
    upstream = config_key(space.upstream(problem_class).to_dict())
    ranked = sorted(shares, key=lambda k: (-sum(shares[k]) / len(shares[k]), -len(shares[k]), repr(k)))
    chosen: list[dict] = []
    for key in ranked if count > 0 else ():
        config = configs[key]
        if key == upstream or space.in_domain(config) or not space.check(config, problem_class, target):
            continue
        chosen.append(config.to_dict())
        if len(chosen) == count:
            break
    return chosen
