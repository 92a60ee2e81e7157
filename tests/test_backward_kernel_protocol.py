"""Backward kernel classes through the kernel-class protocol (issue #44 item 1): a backward class written into
experiment.py alone is a `kernel` value of BackwardConfig, with its own knobs, in the registry, feasibility, the search
space, dispatch, export and the static check; upstream's class alone leaves the space as every stored study has it."""

from dataclasses import replace

import pytest

import experiment
from fa4tune.config import BackwardConfig, ProblemClass
from fa4tune.feasibility import backward_smem_bytes, check_backward
from fa4tune.harness import guards
from fa4tune.kernel_class import backward_kernels, upstream_class
from fa4tune.space import BACKWARD_DOMAIN
from fa4tune.static_check import StaticJob, facts_from_compile, run_static
from fa4tune.targets import get_target
from kernels.backward_sm120 import BackwardSm120
from kernels.cmask_backward_sm120 import CausalAnyWarpsBackwardSm120
from kernels.cmask_kregs_backward_sm120 import KRegsBackwardSm120
from kernels.edge_mask_backward_sm120 import EdgeMaskBackwardSm120
from search.reviewing import export
from search.space import backward_space, get_space
from test_kernel_protocol import ROOT, load_agent

TARGET = get_target("sm120")
D64, D64_CAUSAL = ProblemClass(64, 64, False), ProblemClass(64, 64, True)

# What an agent appends to experiment.py: upstream's backward with `spare_kb` KB of shared memory counted in its
# formula (a stand-in for a class that stages more in shared memory), non-causal only, one Q stage.
AGENT_CLASS = '''

from fa4tune.feasibility import Verdict
from fa4tune.kernel_class import Limits
from kernels.backward_sm120 import BackwardSm120


class SpareBackwardSm120(BackwardSm120):
    """Upstream's SM120 backward with `spare_kb` KB of shared memory set aside in its formula."""

    name = "sm120_spare"
    knobs = {"spare_kb": (1, 2)}
    limits = Limits(num_stages=(1,), causal=False)

    def __init__(self, *args, spare_kb: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.spare_kb = spare_kb

    @classmethod
    def smem_bytes(cls, config, problem_class):
        tiles, breakdown = super().smem_bytes(config, problem_class)
        spare = 1024 * config.extra_knobs["spare_kb"]
        return tiles + spare, f"{breakdown} + spare {spare}"

    @classmethod
    def can_implement(cls, config, problem_class, target):
        if config.num_threads != 128:
            return Verdict(False, "spare_four_warps", "the spare buffer is laid out for 4 warps")
        return super().can_implement(config, problem_class, target)
'''


def spare(spare_kb=2, **knobs):
    return BackwardConfig(**{"num_stages_Q": 1, "num_stages_dO": 1, **knobs}, kernel="sm120_spare", extra={"spare_kb": spare_kb})


def _cut(space):
    """The space on a cut of its domain: the whole one is 295k configs with two classes, seconds to enumerate."""
    return replace(space, domain={**space.domain, "m_block_size": (64,), "n_block_size": (64,), "SdP_swapAB": (False,),
                                  "dKV_swapAB": (False,), "dQ_swapAB": (False,), "V_in_regs": (False,),
                                  "AtomLayoutMSdP": (2, 4, 8), "AtomLayoutNdKV": (2, 4), "AtomLayoutMdQ": (2, 4)})


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    """experiment.py with AGENT_CLASS appended, loaded as the harness loads it."""
    yield from load_agent(tmp_path_factory, AGENT_CLASS)


def test_upstreams_class_is_registered_and_leaves_the_space_as_stored_studies_have_it():
    # our classes are registered and searched: causal classes draw the coordinate-mask ones, non-causal classes the
    # edge-mask one (a `kernel` knob in both, so their studies since then are new storages); upstream's class alone
    # adds no `kernel` knob: the same signature as the stored studies before any other class
    registry = backward_kernels(experiment)
    assert registry == {"sm120": BackwardSm120, "sm120_cmask": CausalAnyWarpsBackwardSm120,
                        "sm120_cmask_kregs": KRegsBackwardSm120, "sm120_edge": EdgeMaskBackwardSm120}
    assert experiment.kernel_class(BackwardConfig()) is BackwardSm120
    searched = backward_space(registry)
    assert searched.domain == {**BACKWARD_DOMAIN, "kernel": ("sm120", "sm120_cmask", "sm120_cmask_kregs", "sm120_edge")}
    assert searched.kernel_knobs["sm120"] == ()
    plain = backward_space({"sm120": BackwardSm120})
    assert plain.domain == BACKWARD_DOMAIN and plain.kernel_knobs == {}  # no `kernel` knob: the same signature as before
    assert searched.for_class(D64, TARGET).domain["kernel"] == ("sm120", "sm120_edge")
    assert searched.for_class(D64_CAUSAL, TARGET).domain["kernel"] == ("sm120", "sm120_cmask", "sm120_cmask_kregs")
    assert upstream_class(BackwardSm120) is not None and export._is_upstream(BackwardConfig())
    assert not export._is_upstream(BackwardConfig(kernel="sm120_edge"))  # a class of ours: not exported as upstream's


def test_an_agents_class_is_a_kernel_value_with_its_own_knob_in_the_space(agent):
    assert backward_kernels() == {"sm120": BackwardSm120, "sm120_cmask": CausalAnyWarpsBackwardSm120,
                                  "sm120_cmask_kregs": KRegsBackwardSm120, "sm120_edge": EdgeMaskBackwardSm120,
                                  "sm120_spare": agent.SpareBackwardSm120}
    assert guards.check_module(agent) == []
    space = get_space("bwd")
    assert space.domain["kernel"] == ("sm120", "sm120_cmask", "sm120_cmask_kregs", "sm120_edge", "sm120_spare") and space.domain["spare_kb"] == (1, 2)
    assert space.signature(TARGET) != backward_space(backward_kernels(experiment)).signature(TARGET)
    cut = _cut(space)
    own = [c for c in cut.feasible(D64, TARGET) if c.kernel == "sm120_spare"]
    assert own and {c.extra_knobs["spare_kb"] for c in own} == {1, 2}
    assert {(c.num_stages_Q, c.num_stages_dO, c.num_threads) for c in own} == {(1, 1, 128)}
    assert not [c for c in cut.feasible(D64_CAUSAL, TARGET) if c.kernel == "sm120_spare"]
    upstreams = [c for c in cut.feasible(D64, TARGET) if c.kernel == "sm120"]
    assert upstreams and all(c.extra == () for c in upstreams) and {c.num_threads for c in upstreams} == {128, 256}
    assert space.config(space.params(spare())) == spare()
    assert space.config({**space.params(BackwardConfig()), "spare_kb": 2}) == BackwardConfig()


def test_feasibility_applies_the_class_limits_formula_and_rules(agent):
    assert check_backward(spare(), D64, TARGET)
    tiles = backward_smem_bytes(BackwardConfig(num_stages_Q=1, num_stages_dO=1), D64)[0]
    assert backward_smem_bytes(spare(), D64) == (tiles + 2048, backward_smem_bytes(BackwardConfig(), D64)[1] + " + spare 2048")
    rules = {
        "causal_supported": check_backward(spare(), D64_CAUSAL, TARGET),
        "num_stages_domain": check_backward(spare(num_stages_Q=2), D64, TARGET),
        "spare_four_warps": check_backward(spare(m_block_size=32, num_threads=256, AtomLayoutMSdP=2, AtomLayoutNdKV=2,
                                                 AtomLayoutMdQ=2), D64, TARGET),
        "kernel_knobs": check_backward(spare(spare_kb=3), D64, TARGET),
        "kernel_known": check_backward(BackwardConfig(kernel="sm120_nothing"), D64, TARGET),
    }
    assert {rule: verdict.rule for rule, verdict in rules.items()} == {rule: rule for rule in rules}
    assert rules["kernel_knobs"].message == "kernel 'sm120_spare' needs spare_kb in 1, 2, got 3"
    assert "runs num_stages_Q in 1, got 2" in rules["num_stages_domain"].message
    # upstream's rules hold for every class built on its code: a causal 64x128 block is wrong for it too
    assert check_backward(BackwardConfig(n_block_size=128), D64_CAUSAL, TARGET).rule == "causal_bwd_square_blocks"


def test_dispatch_picks_the_class_and_export_takes_upstreams_best_trial_in_its_place(agent):
    from search.storing.dispatch_table import edit_dispatch, entry_config

    assert agent.kernel_class(spare()) is agent.SpareBackwardSm120
    # search apply writes a winner of the class as a dispatch entry that reads back as the same config
    source = edit_dispatch((ROOT / "experiment.py").read_text(), "bwd", "d64-noncausal-bf16", spare())
    assert get_space("bwd").config(entry_config(source, "bwd", "d64-noncausal-bf16")) == spare()
    assert upstream_class(agent.SpareBackwardSm120) is None and not export._is_upstream(spare())


def test_a_proposer_sees_the_backward_classes_not_the_forward_ones(agent):
    from fa4tune.config import Problem
    from search.proposing import prompt as prompts
    from search.proposing.proposer import Context

    # the system prompt's list of kernel classes (the whole prompt also lists every rule's first rejection: 6 s a class)
    prompt = prompts._kernel_classes(Context(get_space("bwd"), D64, [Problem(1, 1024, 1024, 8, 8, 64, 64, False)], TARGET, [], k=2))
    assert "- sm120_spare: Upstream's SM120 backward with `spare_kb` KB of shared memory set aside in its formula; own knobs: spare_kb" in prompt
    assert "- sm120: Upstream's SM120 backward (SM80 mma.sync)" in prompt and "sm120_tma" not in prompt


@pytest.mark.compile
def test_the_static_check_compiles_it_for_sm120a_with_its_knob_reaching_the_constructor(agent, tmp_path):
    (facts,) = run_static([StaticJob("bwd", spare(), D64)], TARGET, agent.__file__, workers=1, cache_path=tmp_path / "facts.jsonl")
    assert facts.status == "ok", facts.reason
    assert facts.registers > 0 and facts.spill_store_bytes == 0
    # upstream's struct as BackwardSm120's formula has it, and the class's own 2 KB declared on top
    tiles = backward_smem_bytes(BackwardConfig(num_stages_Q=1, num_stages_dO=1), D64)[0]
    assert facts.dynamic_smem_bytes == tiles and facts.declared_smem_bytes == tiles + 2048


def test_a_backward_class_that_understates_its_shared_memory_is_rejected_with_both_numbers():
    kernel = dict(registers=128, stack_bytes=0, spill_store_bytes=0, spill_load_bytes=0, static_smem_bytes=0,
                  dynamic_smem_bytes=26624, declared_smem_bytes=25600, compile_seconds=1.0)
    facts = facts_from_compile(StaticJob("bwd", spare(), D64), TARGET, "ok", kernel=kernel)
    assert facts.status == "infeasible" and facts.reason.startswith("smem_understated: kernel 'sm120_spare' declares 25600 B")
    # facts stored before backward classes declared theirs (0) are not compared
    assert facts_from_compile(StaticJob("bwd", BackwardConfig(), D64), TARGET, "ok", kernel={**kernel, "declared_smem_bytes": 0}).ok
