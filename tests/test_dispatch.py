"""experiment.py's dispatch tables cover every problem class of the shipped suites with feasible configs."""

import experiment
from fa4tune.config import BackwardConfig, ForwardConfig, ProblemClass
from fa4tune.defaults import fp8_forward, paged_forward, upstream_backward, upstream_forward, wide_backward, wide_forward
from fa4tune.feasibility import check_backward, check_forward, check_forward_problem
from fa4tune.kernel_class import runs_varlen
from fa4tune.suites import load_suite, problem_classes, suite_names
from fa4tune.targets import get_target

TARGET = get_target("sm120")


def _entry_key(table: dict, pc: ProblemClass) -> str:
    """The key whose entry dispatch runs for pc: its own, else its nearest tuned class's (fa4tune.fallback)."""
    return experiment.TABLES.resolution("fwd" if table is experiment.FORWARD_DISPATCH else "bwd", pc).source or pc.name


# Suites of real models' shapes (issue #42) rather than tuning targets: a class of theirs that no study tuned runs
# its nearest tuned class's entry (fa4tune.fallback) or upstream's defaults (test below), so these suites need no
# table entry per class; nor does the wide suite, whose d256 classes run ours for wide heads (fa4tune.defaults).
REAL_SHAPE_SUITES = {"models", "wide"}
OPT_IN_SUITES = {"fp8"}  # FP8 classes: their entries, else the FP8 default (fa4tune.defaults.fp8_forward)


def test_every_suite_problem_class_has_a_feasible_table_entry():
    assert {"standard", "quick"} <= set(suite_names())
    for name in sorted(set(suite_names()) - REAL_SHAPE_SUITES - OPT_IN_SUITES):
        problems = load_suite(name)
        for pc in problem_classes(problems):
            if experiment.TABLES.resolution("fwd", pc).rule == "paged":
                # a paged class no entry runs pages for (a chunk: the TMA entries read no pages) runs ours for paged KV
                assert pc.page_size and experiment.forward_config(pc) == paged_forward(pc), (name, pc.name)
                assert check_forward(paged_forward(pc), pc, TARGET), (name, pc.name)
                continue
            key = _entry_key(experiment.FORWARD_DISPATCH, pc)
            assert key in experiment.FORWARD_DISPATCH, (name, pc.name)
            fwd = experiment.forward_config(pc)
            assert fwd is experiment.FORWARD_DISPATCH[key]
            assert check_forward(fwd, pc, TARGET), (pc.name, check_forward(fwd, pc, TARGET))
            if any(p.backward and p.problem_class == pc for p in problems):
                assert _entry_key(experiment.BACKWARD_DISPATCH, pc) in experiment.BACKWARD_DISPATCH, (name, pc.name)
                bwd = experiment.backward_config(pc)
                assert check_backward(bwd, pc, TARGET), (pc.name, check_backward(bwd, pc, TARGET))


def test_real_shape_suites_run_an_entry_own_or_a_neighbours_or_upstream_defaults_and_each_is_feasible():
    for name in REAL_SHAPE_SUITES:
        problems = load_suite(name)
        for pc in problem_classes(problems):
            fwd = experiment.forward_config(pc)
            key = _entry_key(experiment.FORWARD_DISPATCH, pc)
            default = wide_forward(pc) if pc.head_dim > 192 else upstream_forward(pc)
            assert fwd is experiment.FORWARD_DISPATCH[key] if key in experiment.FORWARD_DISPATCH else fwd == default
            assert check_forward(fwd, pc, TARGET), (name, pc.name, check_forward(fwd, pc, TARGET))
            if any(p.backward and p.problem_class == pc for p in problems):
                bwd = experiment.backward_config(pc)
                key = _entry_key(experiment.BACKWARD_DISPATCH, pc)
                default = wide_backward(pc) if pc.head_dim > 192 else upstream_backward(pc)
                assert bwd is experiment.BACKWARD_DISPATCH[key] if key in experiment.BACKWARD_DISPATCH else bwd == default
                assert check_backward(bwd, pc, TARGET), (name, pc.name, check_backward(bwd, pc, TARGET))


def test_opt_in_fp8_suites_run_fp8_entries_or_the_fp8_default_and_no_backward():
    for name in OPT_IN_SUITES:
        problems = load_suite(name)
        assert problems and all(p.dtype == "fp8" and not p.backward for p in problems)
        for pc in problem_classes(problems):
            fwd = experiment.forward_config(pc)
            assert fwd.kernel == "sm120_fp8" and check_forward(fwd, pc, TARGET), (pc.name, fwd)
            key = _entry_key(experiment.FORWARD_DISPATCH, pc)
            assert fwd is experiment.FORWARD_DISPATCH[key] if key in experiment.FORWARD_DISPATCH else fwd == fp8_forward(pc)
            assert experiment.TABLES.resolution("bwd", pc).rule == "none"


def test_every_forward_entry_runs_its_class_s_shortest_and_its_suites_problems():
    """an entry runs every length of its class: the shortest (1 key for a decode) and every suite problem of it"""
    for key, cfg in experiment.FORWARD_DISPATCH.items():
        shortest = ProblemClass.parse(key).shortest_problem()
        assert shortest.problem_class.name == key
        assert check_forward_problem(cfg, shortest, TARGET), (key, check_forward_problem(cfg, shortest, TARGET))
    for name in suite_names():
        for problem in load_suite(name):  # a packed problem runs its class's varlen config
            cfg = (experiment.varlen_forward_config if problem.lengths else experiment.forward_config)(problem.problem_class)
            assert check_forward_problem(cfg, problem, TARGET), (name, problem.label, check_forward_problem(cfg, problem, TARGET))
            if problem.lengths and not runs_varlen(experiment.kernel_class(experiment.forward_config(problem.problem_class))):
                assert check_forward_problem(experiment.forward_config(problem.problem_class), problem, TARGET).rule == "varlen_kernel"


def test_shortest_problem_of_each_regime_is_in_its_class():
    shortest = {name: ProblemClass.parse(name).shortest_problem()
                for name in ("d128-noncausal-gqa4-decode-bf16", "d128-causal-gqa4-chunked-bf16", "d64-causal-bf16", "d96-noncausal-bf16")}
    assert [(p.seqlen_q, p.seqlen_k) for p in shortest.values()] == [(1, 1), (17, 34), (17, 17), (17, 17)]
    assert all(p.problem_class.name == name for name, p in shortest.items())


def test_table_keys_are_problem_class_names_and_values_configs():
    for name, cfg in experiment.FORWARD_DISPATCH.items():
        assert ProblemClass.parse(name).name == name and isinstance(cfg, ForwardConfig)
    for name, cfg in experiment.BACKWARD_DISPATCH.items():
        assert ProblemClass.parse(name).name == name and isinstance(cfg, BackwardConfig)


def test_a_chunked_class_without_an_entry_takes_a_chunked_entry_then_its_prefill_class_entry_then_upstream():
    from fa4tune.config import Problem

    chunked = Problem(2, 1024, 4096, 16, 16, 128, 128, True).problem_class
    assert chunked.regime == "chunked"
    assert Problem(2, 1024, 2047, 16, 16, 128, 128, True).problem_class.regime == "prefill"  # under 2 keys per query
    assert Problem(2, 1024, 4096, 16, 16, 128, 128, False).problem_class.regime == "prefill"  # not causal
    table = dict(experiment.FORWARD_DISPATCH)
    try:
        experiment.FORWARD_DISPATCH.pop(chunked.name, None)
        experiment.TABLES._resolved.clear()  # the tables memoize what each class runs
        gqa4_chunked = ProblemClass(128, 128, True, 4, regime="chunked").name  # a chunked entry before a prefill one
        assert experiment.forward_config(chunked) is experiment.FORWARD_DISPATCH[gqa4_chunked]
        experiment.FORWARD_DISPATCH.pop(gqa4_chunked)
        experiment.TABLES._resolved.clear()
        assert experiment.forward_config(chunked) is experiment.FORWARD_DISPATCH[ProblemClass(128, 128, True).name]
        unlisted = ProblemClass(80, 80, True, 2, "fp16", "chunked")
        assert experiment.forward_config(unlisted) == upstream_forward(unlisted)
    finally:
        experiment.FORWARD_DISPATCH.clear()
        experiment.FORWARD_DISPATCH.update(table)
        experiment.TABLES._resolved.clear()


def test_unlisted_class_falls_back_to_upstream_defaults():
    pc = ProblemClass(80, 80, True, 2, "fp16")
    assert pc.name not in experiment.FORWARD_DISPATCH
    assert experiment.forward_config(pc) == upstream_forward(pc)
    assert experiment.backward_config(pc) == upstream_backward(pc)


def test_kernel_class_registry():
    from flash_attn.cute.flash_bwd_sm120 import FlashAttentionBackwardSm120
    from flash_attn.cute.flash_fwd_sm120 import FlashAttentionForwardSm120

    from kernels.backward_sm120 import BackwardSm120
    from kernels.tma_forward_sm120 import TmaForwardSm120
    from kernels.tuned_forward_sm120 import TunedForwardSm120

    assert experiment.kernel_class(ForwardConfig()) is TunedForwardSm120
    assert experiment.kernel_class(ForwardConfig(kernel="sm120_tma")) is TmaForwardSm120
    assert experiment.kernel_class(BackwardConfig()) is BackwardSm120  # "sm120", upstream's backward
    assert issubclass(TunedForwardSm120, FlashAttentionForwardSm120)
    assert issubclass(BackwardSm120, FlashAttentionBackwardSm120)
    # upstream's packed GQA dK/dV offset fixed (docs/measurements/2026-12-05-h100-varlen-gqa-backward.md)
    assert "epilogue" in vars(BackwardSm120)
