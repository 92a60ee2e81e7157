"""Transfer: a new study tries the configs that did best on a table's other classes right after its baseline (and
incumbent); the study's own class never counts, infeasible configs and upstream's default are left out, and a GPU
run takes them from the shipped table while a replayed run does not."""

from __future__ import annotations

import optuna

from fa4tune.config import ForwardConfig, ProblemClass
from fa4tune.harness.measurement import Measurement, ProblemResult
from fa4tune.targets import get_target
from search.evaluating.replay import ReplayEvaluator
from search.evaluating.table import ReplayTable
from search.proposing.transfer import TILE_COVERAGE_MAX, transfer_configs
from search.running.runner import _transfers
from search.space import get_space
from search.storing import schema
from search.storing.study import StudySpec, enqueue_baseline

TARGET = get_target("sm120")
STUDIED = ProblemClass(128, 128, True)
OTHERS = (ProblemClass(96, 96, True), ProblemClass(64, 64, True))
GOOD = ForwardConfig(tile_m=64, tile_n=64, num_threads=128, num_stages=1, kernel="sm120_tma")
FAIR = ForwardConfig(tile_m=128, tile_n=64, num_threads=128, num_stages=2)
OWN_BEST = ForwardConfig(tile_m=64, tile_n=128, num_threads=128, num_stages=1, Q_in_regs=True)
TOO_BIG = ForwardConfig(tile_m=256, tile_n=128, num_threads=128, num_stages=2)  # over 99 KB for d128
UPSTREAM = get_space("fwd").upstream(STUDIED)


def _m(pc: ProblemClass, cfg: ForwardConfig, tflops: float | None) -> Measurement:
    result = ProblemResult("p", "fwd", "ok", tflops=tflops) if tflops else ProblemResult("p", "fwd", "incorrect")
    return Measurement("fwd", pc.name, cfg.to_dict(), (result,), "sm120", "test", "replay")


def _table() -> ReplayTable:
    ms = [_m(STUDIED, OWN_BEST, 500.0), _m(STUDIED, GOOD, 100.0)]  # the studied class's own numbers must not count
    for pc in OTHERS:
        ms += [_m(pc, GOOD, 300.0), _m(pc, FAIR, 240.0), _m(pc, UPSTREAM, 310.0), _m(pc, TOO_BIG, 320.0),
               _m(pc, OWN_BEST, None)]  # failed the gate on the others: not proposed
    return ReplayTable(ms)


def test_transfer_ranks_the_other_classes_best_feasible_configs_and_leaves_out_upstream_and_the_own_class():
    space = get_space("fwd").for_class(STUDIED, TARGET)
    chosen = [space.config(c) for c in transfer_configs(_table(), "fwd", STUDIED, space, TARGET)]
    assert chosen == [space.config(GOOD.to_dict()), space.config(FAIR.to_dict())]
    assert transfer_configs(_table(), "fwd", STUDIED, space, TARGET, count=1, cover_tiles=False) == [chosen[0].to_dict()]
    assert transfer_configs(_table(), "fwd", STUDIED, space, TARGET, count=0) == []


def test_where_a_class_has_few_tiles_every_tile_is_tried_once_after_the_top_configs():
    space = get_space("fwd").for_class(STUDIED, TARGET)
    # count=1: the top config's tile (sm120_tma 64x64) is covered; FAIR's tile (sm120 128x64) comes next, once
    chosen = [space.config(c) for c in transfer_configs(_table(), "fwd", STUDIED, space, TARGET, count=1)]
    assert chosen == [space.config(GOOD.to_dict()), space.config(FAIR.to_dict())]
    same_tile = ForwardConfig(tile_m=128, tile_n=64, num_threads=128, num_stages=1)  # FAIR's tile, scored lower
    table = ReplayTable(list(_table().entries.values()) + [_m(pc, same_tile, 200.0) for pc in OTHERS])
    chosen = [space.config(c) for c in transfer_configs(table, "fwd", STUDIED, space, TARGET, count=1)]
    assert chosen == [space.config(GOOD.to_dict()), space.config(FAIR.to_dict())]  # one per tile


def test_the_shipped_table_covers_the_d64_noncausal_backward_best_tile_and_leaves_the_forward_at_the_top_four():
    from search.evaluating.table import load_table
    from search.proposing.transfer import TILE_COVERAGE_MAX, tile_of

    table = load_table("search/data/h200_sweep.json")
    bwd = get_space("bwd")
    d64 = ProblemClass(64, 64, False)
    chosen = transfer_configs(table, "bwd", d64, bwd.for_class(d64, TARGET), TARGET)
    assert (None, 32, 128, 128) in {tile_of(c) for c in chosen}  # the class's best tile, 208th of 220 elsewhere
    assert len({tile_of(c) for c in chosen}) == len(chosen) - 3 <= TILE_COVERAGE_MAX  # the top 4 share a tile
    fwd = get_space("fwd")
    assert len(transfer_configs(table, "fwd", STUDIED, fwd.for_class(STUDIED, TARGET), TARGET)) == 4


def test_a_new_study_queues_baseline_incumbent_then_transfer_without_repeats():
    space = get_space("fwd").for_class(STUDIED, TARGET)
    spec = StudySpec("fwd", STUDIED, (), TARGET, incumbent=GOOD.to_dict(),
                     transfer=tuple(transfer_configs(_table(), "fwd", STUDIED, space, TARGET)))
    study = optuna.create_study(direction="maximize")
    assert enqueue_baseline(study, spec)
    queued = study.get_trials(deepcopy=False)
    assert [t.user_attrs[schema.PROPOSER] for t in queued] == ["baseline", "incumbent", "transfer"]
    assert space.config(queued[2].system_attrs[schema.FIXED_PARAMS]) == space.config(FAIR.to_dict())  # GOOD is the incumbent
    assert not enqueue_baseline(study, spec)  # a study that has trials gets nothing again


def test_a_gpu_run_takes_transfer_configs_from_the_shipped_table_and_a_replayed_run_none():
    spec = StudySpec("bwd", ProblemClass(128, 128, False), (), TARGET)
    (with_transfer,) = _transfers([spec], object(), "search/data/h200_sweep.json")
    assert 4 <= len(with_transfer.transfer) <= 4 + TILE_COVERAGE_MAX
    assert all(with_transfer.space.check(with_transfer.space.config(c), spec.problem_class, TARGET) for c in with_transfer.transfer)
    assert _transfers([spec], object(), "") == [spec]
    assert _transfers([spec], ReplayEvaluator(_table()), "search/data/h200_sweep.json") == [spec]


def test_only_classes_of_the_study_s_kind_count_so_a_window_or_decode_study_gets_nothing_from_plain_prefills():
    """The shipped table holds plain prefill classes: a window, soft-cap, decode or paged study takes no config from
    it (s15's window studies: its configs reached at most 28 % of TPE's best), a chunked study takes the prefills' as the
    fallback rule does, and a plain prefill study keeps its four."""
    from search.evaluating.table import load_table
    from search.proposing.transfer import kin

    table = load_table("search/data/h200_sweep.json")
    fwd = get_space("fwd")
    for name in ("d128-causal-gqa4-window-decode-bf16", "d64-causal-gqa8-window-bf16", "d128-causal-gqa2-softcap-bf16",
                 "d128-causal-gqa4-decode-bf16", "d128-noncausal-gqa4-page16-decode-bf16"):
        pc = ProblemClass.parse(name)
        assert transfer_configs(table, "fwd", pc, fwd.for_class(pc, TARGET), TARGET) == [], name
    chunked = ProblemClass.parse("d128-causal-gqa4-chunked-bf16")
    assert transfer_configs(table, "fwd", chunked, fwd.for_class(chunked, TARGET), TARGET)
    plain = ProblemClass.parse("d128-causal-gqa8-bf16")
    assert len(transfer_configs(table, "fwd", plain, fwd.for_class(plain, TARGET), TARGET)) == 4
    paged, contiguous = (ProblemClass.parse(n) for n in ("d128-causal-gqa4-page16-decode-bf16", "d128-causal-decode-bf16"))
    assert kin(contiguous, paged) and not kin(paged, contiguous)


def test_a_window_or_softcap_study_tries_its_plain_twin_s_entry_first_where_it_runs_the_class(tmp_path):
    """The fallback rule never crosses the window and soft-cap flags, so a window decode with no entry of its own
    started from upstream's SM80 loop; its plain twin's split-KV entry (1.7x the 16 trials' best in s15) now comes
    first among its transfer configs. A replayed study, a plain class and a twin entry that is the incumbent get none."""
    import experiment
    from search.running.runner import _twins

    source = (tmp_path / "experiment.py")
    text = open(experiment.__file__).read()
    source.write_text(text.replace('    "d128-causal-gqa4-window-decode-bf16": DECODE,', ""))
    evaluator = type("Measured", (), {"experiment_path": str(source)})()
    window_decode = ProblemClass.parse("d128-causal-gqa4-window-decode-bf16")
    plain = ProblemClass.parse("d128-causal-gqa4-decode-bf16")
    specs = [StudySpec("fwd", window_decode, (), TARGET, transfer=(FAIR.to_dict(),)), StudySpec("fwd", plain, (), TARGET)]
    twinned, untouched = _twins(specs, evaluator)
    assert twinned.transfer == (experiment.DECODE.to_dict(), FAIR.to_dict()) and untouched == specs[1]
    assert _twins(specs, ReplayEvaluator(_table())) == specs
    held = StudySpec("fwd", window_decode, (), TARGET, incumbent=experiment.DECODE.to_dict())
    assert _twins([held], evaluator) == [held]
    softcap = ProblemClass.parse("d128-causal-gqa2-window-softcap-bf16")  # its twin d128-causal-gqa2's TMA entry runs it
    (gemma,) = _twins([StudySpec("fwd", softcap, (), TARGET)], evaluator)
    assert gemma.transfer == (experiment.TABLES.forward_config(ProblemClass.parse("d128-causal-gqa2-bf16")).to_dict(),)
