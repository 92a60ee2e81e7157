"""The Optuna view of the knobs: evenly spaced integer knobs are ordered distributions, true categories stay
categorical, and a study records which knobs are ordered (its signature changes with them)."""

from __future__ import annotations

import optuna
from optuna.distributions import CategoricalDistribution, IntDistribution

from search.space import distribution, get_space
from search_helpers import TARGET


def test_evenly_spaced_integers_are_ordered_and_everything_else_is_categorical():
    assert distribution((64, 128, 192, 256)) == IntDistribution(64, 256, step=64)
    assert distribution((2, 1)) == IntDistribution(1, 2, step=1)
    assert distribution((32, 64, 128)) == CategoricalDistribution([32, 64, 128])  # geometric: no Optuna distribution fits
    assert distribution((False, True)) == CategoricalDistribution([False, True])  # booleans are ints to Python
    assert distribution(("sm120", "sm120_tma")) == CategoricalDistribution(["sm120", "sm120_tma"])
    assert distribution((128,)) == CategoricalDistribution([128])  # one value: nothing to order


def test_the_forward_tiles_threads_and_stages_reach_the_sampler_as_ordered_knobs():
    space = get_space("fwd")
    kinds = {name: type(d) for name, d in space.distributions().items()}
    assert {n for n, k in kinds.items() if k is IntDistribution} >= {"tile_m", "tile_n", "num_threads", "num_stages"}
    assert kinds["kernel"] is CategoricalDistribution and kinds["Q_in_regs"] is CategoricalDistribution
    assert space.describe(TARGET)["ordered"] == sorted(n for n, k in kinds.items() if k is IntDistribution)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=0))
    for _ in range(3):  # every sampled value lies on the knob's grid and maps back to a config
        trial = study.ask(space.distributions())
        config = space.config(trial.params)
        assert config.tile_m in space.domain["tile_m"] and config.tile_n in space.domain["tile_n"]
        study.tell(trial, 1.0)
    assert isinstance(study.trials[0].distributions["tile_m"], IntDistribution)


def test_a_backward_study_searches_only_its_class_feasible_knob_values():
    """The backward's rules accept ~0.05 % of its product: a study's space is cut to the values its class's feasible
    configs have, so random proposals are feasible far more often; the forward space is not cut."""
    import math

    from fa4tune.config import ProblemClass
    from search.storing.study import StudySpec

    pc = ProblemClass(128, 128, True)
    full, spec = get_space("bwd"), StudySpec("bwd", pc, (), TARGET)
    cut = spec.space
    feasible = full.feasible(pc, TARGET)
    assert len(cut.feasible(pc, TARGET)) == len(feasible) > 0
    assert math.prod(map(len, cut.domain.values())) < math.prod(map(len, full.domain.values())) / 40
    assert cut.domain["V_in_regs"] == (False,)
    # 8 warps on a causal tile only through the coordinate-mask class, and that class only on causal problems
    assert cut.domain["num_threads"] == (128, 256) and cut.domain["kernel"] == ("sm120", "sm120_cmask", "sm120_cmask_kregs")
    assert {c.kernel for c in feasible if c.num_threads == 256} == {"sm120_cmask", "sm120_cmask_kregs"}
    noncausal = StudySpec("bwd", ProblemClass(128, 128, False), (), TARGET).space
    assert noncausal.domain["kernel"] == ("sm120", "sm120_edge")  # the edge-mask class, non-causal only
    assert all(cut.in_domain(c) == "" for c in feasible)
    assert cut.signature(TARGET) != full.signature(TARGET)
    forward = StudySpec("fwd", pc, (), TARGET).space  # not cut to feasible values (only to the classes its regime is offered)
    assert forward.domain == get_space("fwd").offered("prefill").domain
    assert {n: v for n, v in forward.domain.items() if n != "kernel"} == {n: v for n, v in get_space("fwd").domain.items()
                                                                         if n not in ("kernel", "num_splits")}


def test_a_decode_study_searches_small_tiles_and_few_warps():
    """A decode class (at most 16 query tokens) swaps in the decode domain (tiles of 16 and 32 rows on one or two
    warps, where split-KV runs), cut to its feasible values; the dispatch table's decode entry lies in it."""
    from fa4tune.config import ForwardConfig, Problem, ProblemClass
    from search.storing.study import StudySpec

    decode = Problem(1, 1, 4096, 32, 8, 128, 128, False, backward=False).problem_class
    assert decode == ProblemClass(128, 128, False, 4, regime="decode") and decode.name == "d128-noncausal-gqa4-decode-bf16"
    space = StudySpec("fwd", decode, (), TARGET).space
    assert space.per_class is False and space is not get_space("fwd")
    assert {16, 32} <= set(space.domain["tile_m"]) and {32, 64} <= set(space.domain["num_threads"])
    entry = ForwardConfig(32, 64, 64, 2, kernel="sm120_splitkv", extra={"num_splits": 0})
    assert space.in_domain(entry) == "" and get_space("fwd").in_domain(entry) != ""
    assert space.in_domain(space.upstream(decode)) == ""  # the baseline is in it too
    assert all(space.check(c, decode, TARGET) for c in space.feasible(decode, TARGET))
    # an entry runs the class's 1-key decode too: the search proposes no fixed split count above 1
    assert set(space.domain["num_splits"]) == {0, 1}
    fixed = ForwardConfig(32, 64, 64, 2, kernel="sm120_splitkv", extra={"num_splits": 32})
    verdict = get_space("fwd").check(fixed, decode, TARGET)
    assert verdict.rule == "num_splits_le_kv_blocks" and "seqlen_k=1 " in verdict.message


def test_a_new_study_measures_the_dispatch_table_entry_after_the_baseline():
    """search run enqueues the table's entry (when it is not upstream's default) right after upstream's default, so
    `search apply` can tell whether a winner beats what users run today."""
    from fa4tune.config import ProblemClass
    from search.storing import schema
    from search.storing.study import StudySpec, enqueue_baseline

    pc = ProblemClass(128, 128, True)
    entry = {"tile_m": 64, "tile_n": 64, "num_threads": 128, "num_stages": 1, "Q_in_regs": False, "kernel": "sm120_tma"}
    for incumbent, proposers in ((entry, ["baseline", "incumbent"]), (get_space("fwd").upstream(pc).to_dict(), ["baseline"]), (None, ["baseline"])):
        study = optuna.create_study(direction="maximize")
        spec = StudySpec("fwd", pc, (), TARGET, incumbent=incumbent)
        assert enqueue_baseline(study, spec) and not enqueue_baseline(study, spec)  # only into a new study
        waiting = study.get_trials(deepcopy=False)
        assert [t.user_attrs[schema.PROPOSER] for t in waiting] == proposers
        queued = waiting[-1].system_attrs[schema.FIXED_PARAMS]  # a waiting trial holds its params here
        assert spec.space.config(queued) == spec.space.config(incumbent or spec.space.upstream(pc).to_dict())


def test_a_dispatch_entry_on_an_unsearched_kernel_class_is_not_enqueued_and_the_study_still_asks():
    """The protocol lets a dispatch entry run a class the search does not draw (`searched = False`); its config is
    outside the trials' distributions (Optuna's ask raises ValueError on such a fixed param), so the study leaves it
    out rather than fail on its first trial."""
    from fa4tune.config import ProblemClass
    from search.storing import schema
    from search.storing.study import StudySpec, enqueue_baseline

    pc = ProblemClass(128, 128, True)
    entry = {"tile_m": 64, "tile_n": 64, "num_threads": 128, "num_stages": 1, "Q_in_regs": True,
             "kernel": "sm120_tma_bounded", "min_blocks_per_mp": 2}
    spec = StudySpec("fwd", pc, (), TARGET, incumbent=entry)
    assert "kernel='sm120_tma_bounded' is not in the search domain" in spec.space.in_domain(spec.space.config(entry))
    study = optuna.create_study(direction="maximize")
    assert enqueue_baseline(study, spec)
    assert [t.user_attrs[schema.PROPOSER] for t in study.get_trials(deepcopy=False)] == ["baseline"]
    trial = study.ask(spec.space.distributions())  # the baseline's fixed params lie in the distributions
    assert spec.space.config(trial.params) == spec.space.upstream(pc)


def test_an_fp8_study_starts_with_its_incumbent_and_no_upstream_baseline():
    """Upstream has no FP8 path and an fp8 class's domain draws `sm120_fp8` only: its default (kernel sm120) is not
    queued, since Optuna's ask raises ValueError on it (the first GPU fp8 study lost a slot to that, 2026-12-06);
    the FP8 default, queued as the incumbent, is the study's first trial."""
    from fa4tune.config import ProblemClass
    from fa4tune.defaults import fp8_forward
    from search.storing import schema
    from search.storing.study import StudySpec, enqueue_baseline

    pc = ProblemClass.parse("d128-causal-gqa4-fp8")
    default = fp8_forward(pc)
    spec = StudySpec("fwd", pc, (), TARGET, incumbent=default.to_dict())
    assert "kernel='sm120' is not in the search domain" in spec.space.in_domain(spec.space.upstream(pc))
    study = optuna.create_study(direction="maximize")
    assert enqueue_baseline(study, spec)
    assert [t.user_attrs[schema.PROPOSER] for t in study.get_trials(deepcopy=False)] == ["incumbent"]
    trial = study.ask(spec.space.distributions())
    assert spec.space.config(trial.params) == default and default.kernel == "sm120_fp8"


def test_a_prefill_class_is_not_offered_split_kv_and_a_decode_or_chunked_class_is():
    """Issue 68: a 20-trial study of a prefill class drew `sm120_splitkv` six times, all pruned (a prefill's query tiles
    fill the GPU unsplit). A class is offered only to the regimes it declares (split-KV: decode and chunked)."""
    from dataclasses import replace

    from fa4tune.config import Problem, ProblemClass
    from search.storing.study import StudySpec

    full = get_space("fwd")
    prefill_class = ProblemClass(128, 128, True, 4)
    decode_class = Problem(1, 1, 4096, 32, 8, 128, 128, False, backward=False).problem_class
    chunked_class = Problem(1, 512, 8192, 32, 8, 128, 128, True, backward=False).problem_class
    assert (prefill_class.regime, decode_class.regime, chunked_class.regime) == ("prefill", "decode", "chunked")
    prefill, decode, chunked = (StudySpec("fwd", pc, (), TARGET).space for pc in (prefill_class, decode_class, chunked_class))
    assert "sm120_splitkv" in full.domain["kernel"] and "num_splits" in full.domain
    assert prefill.domain["kernel"] == tuple(k for k in full.domain["kernel"] if k != "sm120_splitkv") and "num_splits" not in prefill.domain
    assert "sm120_splitkv" not in prefill.kernel_knobs
    assert not [c for c in prefill.feasible(prefill_class, TARGET) if c.kernel == "sm120_splitkv"]
    assert "sm120_splitkv" in decode.domain["kernel"] and "sm120_splitkv" in chunked.domain["kernel"]
    assert [c for c in decode.feasible(decode_class, TARGET) if c.kernel == "sm120_splitkv"]
    # the decode and chunked classes' spaces are those their studies were stored with: nothing changed for them
    for pc, space in ((decode_class, decode), (chunked_class, chunked)):
        assert space.signature(TARGET) == replace(full, kernel_regimes={}).for_class(pc, TARGET).signature(TARGET)
    # no sampler can draw it for the prefill class
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    drawn = set()
    for _ in range(40):
        trial = study.ask(prefill.distributions())
        drawn.add(prefill.config(trial.params).kernel)
        study.tell(trial, 1.0)
    assert "sm120_splitkv" not in drawn and len(drawn) > 2


def test_a_prefill_study_stored_before_the_cut_loads_and_resumes_with_the_space_it_was_made_with(tmp_path):
    """A study stored before the prefill classes' spaces left split-KV out has a `kernel` categorical with it: Optuna
    refuses other choices for that knob within the study, so the study keeps its own space (check_existing and the
    workers' spec_of say which), resumes, and a study made with yet another space is still refused."""
    from dataclasses import replace

    import pytest

    from fa4tune.config import ConfigError, ForwardConfig, Problem
    from search.running.worker import spec_of
    from search.storing import schema
    from search.storing.study import StudySpec, check_existing, open_study

    url = f"sqlite:///{tmp_path / 'old.db'}"
    problem = Problem(1, 2048, 2048, 32, 8, 128, 128, True, backward=False, name="gqa prefill 2k")
    pc = problem.problem_class
    before = replace(get_space("fwd"), kernel_regimes={}).for_class(pc, TARGET)  # the space such a study was made with
    old = StudySpec("fwd", pc, (problem,), TARGET, space_override=before)
    study = open_study(url, old, optuna.samplers.TPESampler(seed=0))
    study.set_user_attr(schema.PROBLEM_SPECS, [problem.to_dict()])
    split = ForwardConfig(64, 64, 128, 1, kernel="sm120_splitkv", extra={"num_splits": 2})
    study.enqueue_trial(before.params(split))
    trial = study.ask(before.distributions())
    assert before.config(trial.params) == split
    study.tell(trial, state=optuna.trial.TrialState.PRUNED)  # as the six split-KV trials of issue 68 were

    today = StudySpec("fwd", pc, (problem,), TARGET)
    assert today.space.signature(TARGET) != study.user_attrs[schema.SPACE_SIGNATURE]
    with pytest.raises(ValueError, match="dynamic value space"):  # why the stored space must stay the study's
        study.ask(today.space.distributions())
    (resumed,) = check_existing(url, [today])
    assert resumed.space.signature(TARGET) == study.user_attrs[schema.SPACE_SIGNATURE]
    assert "sm120_splitkv" in resumed.space.domain["kernel"]
    study = open_study(url, resumed, optuna.samplers.TPESampler(seed=0))
    trial = study.ask(resumed.space.distributions())  # TPE reads the stored split-KV trial and proposes on
    study.tell(trial, 1.0)
    assert len(study.trials) == 3  # the refused ask left a trial RUNNING (a run closes such trials when it starts)
    worker = spec_of(optuna.load_study(study_name=today.name, storage=url), "standard")
    assert worker.space.signature(TARGET) == study.user_attrs[schema.SPACE_SIGNATURE]
    # a new study of the same class gets today's space
    assert check_existing(url, [replace(today, problem_class=pc.__class__.parse("d128-causal-gqa4-fp16"))])[0].space.signature(TARGET) \
        != study.user_attrs[schema.SPACE_SIGNATURE]
    other = optuna.create_study(study_name="fwd:d64-causal-bf16:sm120", storage=url)
    other.set_user_attr(schema.SPACE_SIGNATURE, "0123456789abcdef")
    with pytest.raises(ConfigError, match="exists with another search space"):
        check_existing(url, [StudySpec("fwd", pc.__class__.parse("d64-causal-bf16"), (), TARGET)])
