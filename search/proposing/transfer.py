"""Transfer: a new study's first proposals after the baseline are the configs that were fastest on the *other*
problem classes of a recorded table (the shipped H200 sweep, search/data/h200_sweep.json), as in warm-starting a
hyperparameter search from a portfolio of configs that did well on related tasks. They are enqueued with proposer
`transfer` by search.storing.study.enqueue_baseline.

A config's score is its geomean TFLOPS as a share of its class's best, averaged over the classes of the same
direction that measured it and passed the gate; the study's own class never counts (a study learns nothing from a
table that already holds its answer, and the bench that measures this leaves the class out the same way). Only
configs that today's rules accept for the study's class, in the study's space, are proposed: the top
TRANSFER_CONFIGS, best first, without upstream's default (the baseline measures it anyway).

Only classes of the study's kind count: the same regime (a chunked class counts prefill ones too, as the fallback
rule does), the same window and soft-cap, fp8 with fp8, and no paged class for a contiguous one; head dims, GQA ratio
and dtype may differ. The shipped table holds plain prefill classes measured on upstream's SM80 loop. Offered to the
window and window-decode studies of 2026-12-07 s15 (docs/measurements/2026-12-07-h100-s15-window-decode-softcap-
studies.md), its configs reached 3.0, 16.4, 74.8 and 0.0 TFLOPS against their TPE's 10.6, 128.9, 322.7 and 0.7, and
took 12 of a window decode's 16 trials.

Where the class's feasible configs span at most TILE_COVERAGE_MAX tiles (a tile: the kernel class, the block
sizes and the thread count), the list goes on with the best-scoring config of each tile not yet
covered. A class's best can sit in a tile that did poorly elsewhere: the d64 non-causal backward's best (32x128,
128 threads) ranks 208th of 220 on the other classes, and the 4 top configs, all one 64x64 tile, left TPE anchored
there (122 evaluations to 99 % of the best against random search's 48). With every tile tried once it needs 8. The
forward spaces have 16-24 tiles: covering them cost more evaluations than it saved, so they get the top 4 alone
(docs/measurements/2026-12-01-transfer-tiles-bench.md).
"""

from __future__ import annotations

from collections import defaultdict

TRANSFER_CONFIGS = 4
TILE_COVERAGE_MAX = 12  # tiles in a class's space; above it, no tile coverage


def tile_of(config: dict) -> tuple:
    """The config's tile: its kernel class, block sizes and thread count (forward or backward knob names)."""
    return (config.get("kernel"), config.get("tile_m", config.get("m_block_size")), config.get("tile_n", config.get("n_block_size")),
            config.get("num_threads"))


def kin(other, problem_class) -> bool:
    """Whether a table's class `other` is of `problem_class`'s kind (the module's docstring): its measurements count."""
    from fa4tune.config import FP8

    regimes = ("chunked", "prefill") if problem_class.regime == "chunked" else (problem_class.regime,)
    return (other.regime in regimes and (other.window, other.softcap) == (problem_class.window, problem_class.softcap)
            and (other.dtype == FP8) == (problem_class.dtype == FP8) and bool(problem_class.page_size or not other.page_size))


def transfer_configs(table, kind: str, problem_class, space, target, count: int = TRANSFER_CONFIGS,
                     cover_tiles: bool = True) -> list[dict]:
    """Up to `count` config dicts for `problem_class`, best transfer score first, then (`cover_tiles`) one per tile
    not yet covered where the class has few tiles (see the module's docstring)."""
    from fa4tune.config import ProblemClass
    from search.storing.history import config_key

    shares: dict[tuple, list[float]] = defaultdict(list)
    configs: dict[tuple, object] = {}
    for other in table.problem_classes(kind):
        best = table.best(kind, other)
        if other == problem_class.name or not best or not kin(ProblemClass.parse(other), problem_class):
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
    feasible = [configs[key].to_dict() for key in ranked
                if key != upstream and not space.in_domain(configs[key]) and space.check(configs[key], problem_class, target)]
    chosen = feasible[:max(count, 0)]
    tiles = {tile_of(c) for c in feasible}
    if not cover_tiles or not chosen or len(tiles) > TILE_COVERAGE_MAX:
        return chosen
    covered = {tile_of(c) for c in chosen}
    for config in feasible:
        if tile_of(config) not in covered:
            covered.add(tile_of(config))
            chosen.append(config)
    return chosen
