import itertools
import math
import random

import pytest

from fa4tune.census import COMPILE_RULES
from fa4tune.config import BackwardConfig, ForwardConfig, ProblemClass
from fa4tune.feasibility import (
    GATE_RULES,
    check_backward,
    check_forward,
    forward_smem_bytes,
    upstream_can_implement_backward,
    upstream_can_implement_forward,
)
from fa4tune.kernel_class import forward_kernel, upstream_class
from fa4tune.space import BACKWARD_DOMAIN, feasible_forward, forward_candidates, forward_domain
from fa4tune.targets import get_target

TARGET = get_target("sm120")
CLASSES = [
    ProblemClass(64, 64, False), ProblemClass(64, 64, True), ProblemClass(96, 96, True),
    ProblemClass(128, 128, False), ProblemClass(128, 128, True, 4), ProblemClass(192, 128, False),
    ProblemClass(256, 256, False),
]
# Rules that upstream's can_implement also has: where upstream rejects, ours must reject by one of these.
UPSTREAM_FWD_RULES = {"tile_n_multiple_of_16", "num_threads_multiple_of_32", "smem_capacity", "tile_m_x2_divisible_by_num_threads"}
UPSTREAM_BWD_RULES = {"n_block_size_multiple_of_16", "num_threads_multiple_of_32", "smem_capacity"}
OUR_EXTRA_FWD_RULES = {"tile_m_domain", "tile_n_domain", "num_threads_domain", "num_stages_domain", "kernel_known",
                       "Q_in_regs_one_stage", "pack_gqa_tile_m_power_of_two", "pack_gqa_tile_m_le_num_threads"}
OUR_EXTRA_RULES = {"causal_bwd_square_blocks", "num_stages_Q_ge_dO", "smem_capacity", *COMPILE_RULES, *GATE_RULES}  # smem: the compiled struct


def _wide_forward_candidates():
    # wider than the search domain, so that upstream's own rules (tile_n % 16, threads % 32) are exercised
    for tile_m, tile_n, threads, stages, q_in_regs in itertools.product(
        (32, 64, 96, 128, 192, 256), (24, 32, 48, 64, 96, 128, 160, 256), (64, 96, 128, 160, 256, 384), (1, 2, 3), (False, True)
    ):
        yield ForwardConfig(tile_m, tile_n, threads, stages, q_in_regs)


@pytest.mark.parametrize("pc", CLASSES, ids=lambda pc: pc.name)
def test_forward_rules_agree_with_upstream_can_implement(pc):
    for cfg in list(_wide_forward_candidates()) + forward_candidates():
        ours = check_forward(cfg, pc, TARGET)
        theirs = upstream_can_implement_forward(cfg, pc)
        if not theirs:
            assert not ours, f"upstream rejects, we accept: {cfg}"
            # or a kernel of our own's declared head dims (its Limits: sm120_splitkv runs 64 to 128)
            # (or, for a kernel that is not upstream's code at all, a rule of its own)
            own_kernel = upstream_class(forward_kernel(cfg.kernel)) is None
            own_rule = own_kernel and ours.rule in ("head_dim_domain", "fp8_opt_in")
            assert own_rule or ours.rule in UPSTREAM_FWD_RULES | {"tile_n_domain", "num_threads_domain", "tile_m_domain", "num_stages_domain"}, (cfg, ours)
        elif not ours:
            # upstream has no rule here: ours must name a rule upstream lacks, or be the shared-memory formula of
            # a kernel of our own (the TMA kernel's mbarriers come on top of upstream's tiles)
            # the head dims a kernel of our own declares it runs (its Limits: sm120_splitkv runs 64 to 128)
            own_kernel = upstream_class(forward_kernel(cfg.kernel)) is None
            own_rules = ("smem_capacity", "head_dim_domain", "fp8_opt_in")  # sm120_fp8 serves no bf16 / fp16 class
            assert ours.rule in OUR_EXTRA_FWD_RULES or (own_kernel and ours.rule in own_rules), (cfg, ours)


@pytest.mark.parametrize("pc", CLASSES[:5], ids=lambda pc: pc.name)
def test_backward_rules_agree_with_upstream_can_implement(pc):
    rng = random.Random(0)
    names = list(BACKWARD_DOMAIN)
    domain = dict(BACKWARD_DOMAIN, n_block_size=(24, 32, 64, 128), num_threads=(96, 128, 256))
    for _ in range(4000):
        cfg = BackwardConfig(**{n: rng.choice(domain[n]) for n in names})
        ours = check_backward(cfg, pc, TARGET)
        theirs = upstream_can_implement_backward(cfg, pc)
        if not theirs:
            assert not ours and ours.rule in UPSTREAM_BWD_RULES, (cfg, ours)
        elif not ours:
            assert ours.rule in OUR_EXTRA_RULES, (cfg, ours)


def test_smem_rejection_names_rule_and_numbers():
    pc = ProblemClass(128, 128, False)
    verdict = check_forward(ForwardConfig(tile_m=128, tile_n=128, num_threads=128, num_stages=2), pc, TARGET)
    assert not verdict and verdict.rule == "smem_capacity"
    assert "163840 B" in verdict.message and "101376 B" in verdict.message
    assert str(verdict).startswith("smem_capacity: needs 163840 B")


def test_q_in_regs_shares_q_and_v():
    pc = ProblemClass(128, 128, False)
    plain, _ = forward_smem_bytes(ForwardConfig(128, 128, 128, 1, False), pc)
    shared, breakdown = forward_smem_bytes(ForwardConfig(128, 128, 128, 1, True), pc)
    assert plain == 3 * 32768 and shared == 2 * 32768 and "Q_in_regs" in breakdown


def test_rows_per_warp_rule_message():
    verdict = check_forward(ForwardConfig(tile_m=64, tile_n=64, num_threads=256), ProblemClass(64, 64, False), TARGET)
    assert verdict.rule == "tile_m_x2_divisible_by_num_threads"
    assert "8 MMA warps" in verdict.message and "multiple of 128" in verdict.message and "128" in verdict.message


def test_unknown_kernel_rejected():
    verdict = check_forward(ForwardConfig(kernel="nope"), ProblemClass(64, 64, False), TARGET)
    assert verdict.rule == "kernel_known" and "'nope'" in verdict.message


def test_feasible_space_size_is_sane():
    # thirty to a hundred configs per class and kernel variant (a kernel with its own knobs' values): small enough
    # for an exhaustive sweep, large enough to tune
    for pc in CLASSES[:5]:
        feasible = feasible_forward(pc, TARGET)
        for kernel in forward_domain()["kernel"]:
            variants = math.prod(len(values) for values in forward_kernel(kernel).knobs.values())
            n = sum(cfg.kernel == kernel for cfg in feasible)
            if kernel == "sm120_fp8":  # opt-in (fa4tune.fp8.attention_fp8): feasible for no bf16 / fp16 class
                assert n == 0, (pc.name, n)
                continue
            assert 30 * variants <= n <= 100 * variants, (pc.name, kernel, n, variants)
    assert feasible_forward(ProblemClass(256, 256, False), TARGET) == [
        cfg for cfg in feasible_forward(ProblemClass(256, 256, False), TARGET) if forward_smem_bytes(cfg, ProblemClass(256, 256, False))[0] <= 101376
    ]


def test_upstream_defaults_are_feasible():
    from fa4tune.defaults import upstream_backward, upstream_forward

    for pc in CLASSES[:5]:
        assert check_forward(upstream_forward(pc), pc, TARGET)
        assert check_backward(upstream_backward(pc), pc, TARGET)


def test_rules_found_by_measuring_and_compiling():
    target = TARGET
    v = check_forward(ForwardConfig(128, 64, 128, 2, True), ProblemClass(128, 128, False), target)
    assert v.rule == "Q_in_regs_one_stage" and "num_stages=2" in v.message
    v = check_forward(ForwardConfig(192, 32, 128, 1, False), ProblemClass(128, 128, True, 4), target)
    assert v.rule == "pack_gqa_tile_m_power_of_two" and "192" in v.message
    assert check_forward(ForwardConfig(192, 32, 128, 1, False), ProblemClass(128, 128, True, 1), target)
    v = check_forward(ForwardConfig(256, 64, 128, 1, False), ProblemClass(128, 128, True, 4), target)
    assert v.rule == "pack_gqa_tile_m_le_num_threads" and "256" in v.message
    assert check_forward(ForwardConfig(256, 64, 256, 1, False), ProblemClass(128, 128, True, 4), target)
    v = check_backward(BackwardConfig(m_block_size=64, n_block_size=32, AtomLayoutNdKV=2), ProblemClass(128, 128, True), target)
    assert v.rule == "causal_bwd_square_blocks" and "64x32" in v.message
    assert check_backward(BackwardConfig(m_block_size=64, n_block_size=32, AtomLayoutNdKV=2), ProblemClass(128, 128, False), target)
