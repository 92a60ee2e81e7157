"""The kernel-class protocol (fa4tune.kernel_class): a class written into experiment.py alone is a tunable `kernel`
value, with its own knobs, in the registry, feasibility, the search space, the static check, dispatch and export."""

import sys
import types
from pathlib import Path

import pytest

import experiment
from fa4tune.config import ConfigError, ForwardConfig, Problem, ProblemClass
from fa4tune.feasibility import check_forward, check_forward_problem
from fa4tune.harness import candidates, guards
from fa4tune.kernel_class import Limits, forward_kernels, upstream_class
from fa4tune.static_check import StaticJob, facts_from_compile, run_static
from fa4tune.targets import get_target
from kernels.fp8_forward_sm120 import Fp8ForwardSm120
from kernels.splitkv_forward_sm120 import SplitKvForwardSm120
from kernels.tma_forward_sm120 import TmaForwardSm120
from kernels.tma_lpt_forward_sm120 import TmaLptForwardSm120
from kernels.tma_paired_forward_sm120 import TmaPairedForwardSm120
from kernels.tma_trimmed_forward_sm120 import TmaTrimmedForwardSm120
from kernels.tuned_forward_sm120 import TunedForwardSm120
from search.reviewing.export import upstream_kernel
from search.space import forward_space, get_space

ROOT = Path(__file__).resolve().parent.parent
TARGET = get_target("sm120")
D64, D64_CAUSAL = ProblemClass(64, 64, False), ProblemClass(64, 64, True)

# What an agent appends to experiment.py: upstream's forward with `spare_kb` KB of shared memory it does not use,
# declared in its formula, and its own rules (no causal, one stage, no Q_in_regs).
AGENT_CLASS = '''

import cutlass
import cutlass.cute as cute

from fa4tune.feasibility import Verdict
from fa4tune.kernel_class import Limits
from kernels.tuned_forward_sm120 import TunedForwardSm120


class SpareForwardSm120(TunedForwardSm120):
    """Upstream's SM120 forward with `spare_kb` KB of shared memory it does not use."""

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
        if config.Q_in_regs:
            return Verdict(False, "spare_without_Q_in_regs", "the spare buffer keeps Q and V apart")
        return super().can_implement(config, problem_class, target)

    def _get_shared_storage_cls(self):
        sQ_struct, sK_struct, sV_struct = [
            cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(layout)], 1024]
            for layout in (self.sQ_layout, self.sK_layout, self.sV_layout)
        ]
        spare_struct = cute.struct.Align[cute.struct.MemRange[cutlass.Int8, 1024 * self.spare_kb], 1024]

        @cute.struct
        class SharedStorage:
            sV: sV_struct
            sQ: sQ_struct
            sK: sK_struct
            spare: spare_struct

        return SharedStorage
'''


def spare(tile_m=64, tile_n=64, num_stages=1, Q_in_regs=False, **extra):
    return ForwardConfig(tile_m, tile_n, 128, num_stages, Q_in_regs, kernel="sm120_spare", extra=extra or {"spare_kb": 2})


def load_agent(tmp_path_factory, source: str):
    """A copy of experiment.py with `source` appended, loaded as the harness loads it (module `experiment`), for
    the tests of a module; the shipped experiment module is put back after them."""
    path = tmp_path_factory.mktemp("agent") / "experiment.py"
    path.write_text((ROOT / "experiment.py").read_text() + source)
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "experiment", experiment)
        yield candidates.load_experiment(path)


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    """experiment.py with AGENT_CLASS appended."""
    yield from load_agent(tmp_path_factory, AGENT_CLASS)


def test_ours_are_registered_from_kernels_and_experiment_py_adds_its_own(agent):
    # ours in kernels/, by name; an agent's class in experiment.py joins them
    assert forward_kernels(experiment) == {"sm120": TunedForwardSm120,
                                           "sm120_tma": TmaForwardSm120,
                                           "sm120_tma_lpt": TmaLptForwardSm120,
                                           "sm120_tma_paired": TmaPairedForwardSm120,
                                           "sm120_tma_trimmed": TmaTrimmedForwardSm120,
                                           "sm120_splitkv": SplitKvForwardSm120,
                                           "sm120_fp8": Fp8ForwardSm120}
    registry = forward_kernels()  # the module loaded as `experiment`: the agent's copy
    assert list(registry) == ["sm120", "sm120_fp8", "sm120_splitkv", "sm120_tma", "sm120_tma_lpt", "sm120_tma_paired", "sm120_tma_trimmed",
                              "sm120_spare"]
    assert registry["sm120_spare"] is agent.SpareForwardSm120
    assert guards.check_module(agent) == []  # experiment.py may import the protocol and our classes


def test_the_class_is_a_kernel_value_with_its_own_knob_in_the_space(agent):
    space = get_space("fwd")
    assert space.domain["kernel"] == ("sm120", "sm120_splitkv", "sm120_tma", "sm120_tma_lpt", "sm120_tma_paired",
                                      "sm120_tma_trimmed", "sm120_spare") and space.domain["spare_kb"] == (1, 2)
    assert space.signature(TARGET) != forward_space(forward_kernels(experiment)).signature(TARGET)
    feasible = space.feasible(D64, TARGET)
    own = [c for c in feasible if c.kernel == "sm120_spare"]
    assert {c.extra_knobs["spare_kb"] for c in own} == {1, 2} and {(c.num_stages, c.Q_in_regs) for c in own} == {(1, False)}
    # the knob applies to its class only (experiment.py's split-KV class carries its own num_splits)
    assert all(c.extra == () for c in feasible if c.kernel in ("sm120", "sm120_tma"))
    assert all(dict(c.extra).keys() == {"num_splits"} for c in feasible if c.kernel == "sm120_splitkv")
    assert not [c for c in space.feasible(D64_CAUSAL, TARGET) if c.kernel == "sm120_spare"]
    # Optuna's params carry every knob; a config takes its own class's
    assert space.config(space.params(spare())) == spare()
    assert space.config({**space.params(ForwardConfig()), "spare_kb": 2}) == ForwardConfig()
    assert space.in_domain(spare(spare_kb=3)) == "spare_kb=3 is not in the search domain (1, 2)"


def test_feasibility_applies_the_class_limits_formula_and_rules(agent):
    assert check_forward(spare(), D64, TARGET)
    rules = {
        "causal_supported": check_forward(spare(), D64_CAUSAL, TARGET),
        "num_stages_domain": check_forward(spare(num_stages=2), D64, TARGET),
        "spare_without_Q_in_regs": check_forward(spare(Q_in_regs=True), D64, TARGET),
        # 48 + 240 + 240 rows of 96 columns fill the 101376 B exactly: the spare 2 KB do not fit
        "smem_capacity": check_forward(spare(48, 240), ProblemClass(96, 96, False), TARGET),
    }
    assert {rule: verdict.rule for rule, verdict in rules.items()} == {rule: rule for rule in rules}
    assert "needs 103424 B" in rules["smem_capacity"].message and "spare 2048" in rules["smem_capacity"].message
    assert check_forward(ForwardConfig(48, 240, 96, 1), ProblemClass(96, 96, False), TARGET)  # upstream's fits
    knobs = [check_forward(c, D64, TARGET) for c in (spare(spare_kb=3), ForwardConfig(64, kernel="sm120_spare"),
                                                         ForwardConfig(64, extra={"spare_kb": 1}))]
    assert [v.rule for v in knobs] == ["kernel_knobs"] * 3
    assert [v.message for v in knobs] == [
        "kernel 'sm120_spare' needs spare_kb in 1, 2, got 3",
        "kernel 'sm120_spare' needs knob 'spare_kb' (its own knobs: spare_kb)",
        "kernel 'sm120' has no knob 'spare_kb' (its own knobs: none)",
    ]


def test_dispatch_and_export_read_the_class(agent):
    assert agent.kernel_class(spare()) is agent.SpareForwardSm120
    assert agent.kernel_class(ForwardConfig(kernel="sm120_tma")) is TmaForwardSm120
    from flash_attn.cute.flash_fwd_sm120 import FlashAttentionForwardSm120

    assert upstream_kernel(ForwardConfig()) is FlashAttentionForwardSm120
    for config, where in ((spare(), "experiment.SpareForwardSm120"), (ForwardConfig(kernel="sm120_tma"), "kernels.tma_forward_sm120.TmaForwardSm120")):
        with pytest.raises(ConfigError) as err:
            upstream_kernel(config)
        assert err.value.rule == "kernel_not_upstream" and where in str(err.value)
    assert upstream_class(agent.SpareForwardSm120) is None  # a subclass changes the code: it does not inherit `upstream`


@pytest.mark.compile
def test_the_static_check_compiles_it_with_its_knob_reaching_the_constructor(agent, tmp_path):
    (facts,) = run_static([StaticJob("fwd", spare(), D64)], TARGET, agent.__file__, workers=1, cache_path=tmp_path / "facts.jsonl")
    assert facts.status == "ok", facts.reason
    # the tiles (3 x 8 KB) and the 2 KB the constructor's spare_kb=2 added: the storage the class declares
    assert facts.dynamic_smem_bytes == facts.declared_smem_bytes == 3 * 8192 + 2048


def test_a_class_that_understates_its_shared_memory_is_rejected_with_both_numbers():
    kernel = dict(registers=128, stack_bytes=0, spill_store_bytes=0, spill_load_bytes=0, static_smem_bytes=1024,
                  dynamic_smem_bytes=26624, declared_smem_bytes=25600, compile_seconds=1.0)
    facts = facts_from_compile(StaticJob("fwd", spare(), D64), TARGET, "ok", kernel=kernel)
    assert facts.status == "infeasible" and facts.reason == (
        "smem_understated: kernel 'sm120_spare' declares 25600 B of shared memory (its smem_bytes), the compiled "
        "kernel's shared storage is 26624 B")
    assert facts_from_compile(StaticJob("fwd", spare(), D64), TARGET, "ok", kernel={**kernel, "declared_smem_bytes": 26624}).ok


def _module(*classes: dict) -> types.ModuleType:
    """A stand-in experiment module defining kernel classes (each: bases and class attributes)."""
    module = types.ModuleType("fake_experiment")
    for attrs in classes:
        attrs = dict(attrs)
        bases = attrs.pop("bases", (TunedForwardSm120,))
        cls = type(attrs.pop("cls"), bases, {"__module__": module.__name__, **attrs})
        setattr(module, cls.__name__, cls)
    return module


def test_the_registry_takes_classes_by_their_own_name_and_refuses_a_taken_one():
    helper = _module({"cls": "Helper"}, {"cls": "Mine", "name": "sm120_mine"})
    assert list(forward_kernels(helper)) == ["sm120", "sm120_fp8", "sm120_splitkv", "sm120_tma", "sm120_tma_lpt", "sm120_tma_paired",
                                             "sm120_tma_trimmed", "sm120_mine"]  # Helper declares no name: a base
    with pytest.raises(ConfigError) as err:
        forward_kernels(_module({"cls": "FasterTma", "bases": (TmaForwardSm120,), "name": "sm120_tma"}))
    assert err.value.rule == "kernel_name_taken"
    assert "fake_experiment.FasterTma and kernels.tma_forward_sm120.TmaForwardSm120 both declare name = 'sm120_tma'" in str(err.value)


def test_a_class_that_is_not_searched_runs_from_the_table_but_is_never_drawn():
    module = _module({"cls": "Kept", "bases": (TmaForwardSm120,), "name": "sm120_kept", "knobs": {"depth": (1, 2)}, "searched": False},
                     {"cls": "Drawn", "bases": (TmaForwardSm120,), "name": "sm120_drawn"})
    kernels = forward_kernels(module)
    space = forward_space(kernels)
    assert "sm120_kept" in kernels and "sm120_kept" not in space.domain["kernel"] and "depth" not in space.domain
    assert "sm120_drawn" in space.domain["kernel"]
    kept = ForwardConfig(64, 64, 128, 1, kernel="sm120_kept", extra={"depth": 1})
    assert check_forward(kept, D64, TARGET, kernels)  # a dispatch entry of it stays feasible
    assert not [c for c in space.feasible(D64, TARGET) if c.kernel == "sm120_kept"]
    assert space.in_domain(kept) == "kernel='sm120_kept' is not in the search domain (" + ", ".join(map(repr, space.domain["kernel"])) + ")"
    # the flag is inherited: a subclass of a kept class is searched only if it says so
    kept = _module({"cls": "Kept", "bases": (TmaForwardSm120,), "name": "sm120_kept", "searched": False}).Kept
    module = _module({"cls": "Mine", "bases": (kept,), "name": "sm120_mine", "searched": True})
    assert "sm120_mine" in forward_space(forward_kernels(module)).domain["kernel"]


def test_a_class_is_offered_only_to_the_regimes_it_declares_and_a_subclass_inherits_them():
    """A decode-only class of the agent's joins the decode and not the prefill classes' spaces; dispatch entries and
    the static rules still run it anywhere."""
    module = _module({"cls": "Decode", "name": "sm120_decode", "knobs": {"depth": (1, 2)}, "regimes": frozenset({"decode"})})
    kernels = forward_kernels(module)
    space = forward_space(kernels)
    decode = Problem(1, 1, 4096, 32, 8, 128, 128, False, backward=False).problem_class
    prefill = space.for_class(D64, TARGET)
    assert "sm120_decode" in space.domain["kernel"] and "depth" in space.domain  # the whole space holds it
    assert "sm120_decode" not in prefill.domain["kernel"] and "depth" not in prefill.domain
    assert "sm120_decode" not in prefill.kernel_knobs and "sm120_tma" in prefill.domain["kernel"]
    assert decode.regime == "decode" and "sm120_decode" in space.offered(decode.regime).domain["kernel"]
    assert check_forward(ForwardConfig(64, 64, 128, 1, kernel="sm120_decode", extra={"depth": 1}), D64, TARGET, kernels)
    child = _module({"cls": "Child", "bases": (module.Decode,), "name": "sm120_child"})
    assert "sm120_child" not in forward_space(forward_kernels(child)).for_class(D64, TARGET).domain["kernel"]


@pytest.mark.parametrize("attrs,words", [
    ({"name": "x", "searched": "no"}, "searched must be True or False"),
    ({"name": "x", "regimes": frozenset({"prefill", "training"})}, "regimes must be a non-empty frozenset of prefill, decode, chunked"),
    ({"name": "x", "regimes": ("decode",)}, "regimes must be a non-empty frozenset"),
    ({"name": "sm120 fast"}, "name must be an identifier-like string"),
    ({"name": "x", "knobs": {"tile_m": (64,)}}, "knob 'tile_m' is one of ForwardConfig's own knobs"),
    ({"name": "x", "knobs": {"depth": []}}, "knob 'depth' needs a non-empty tuple"),
    ({"name": "x", "limits": {"causal": False}}, "limits must be a fa4tune.kernel_class.Limits"),
])
def test_a_bad_declaration_is_named(attrs, words):
    with pytest.raises(ConfigError) as err:
        forward_kernels(_module({"cls": "Bad", **attrs}))
    assert err.value.rule == "kernel_class_declaration" and "fake_experiment.Bad" in str(err.value) and words in str(err.value)


def test_sequence_length_and_gqa_limits_are_checked_per_problem_and_class():
    module = _module({"cls": "Decode", "name": "sm120_decode", "limits": Limits(seqlen_q=(1, 16), gqa=False, head_dim=(64, 128))})
    kernels = forward_kernels(module)
    cfg = ForwardConfig(kernel="sm120_decode")
    decode, prefill = Problem(1, 8, 4096, 8, 8, 128, 128, False), Problem(1, 4096, 4096, 8, 8, 128, 128, False)
    assert check_forward_problem(cfg, decode, TARGET, kernels)
    verdict = check_forward_problem(cfg, prefill, TARGET, kernels)
    assert verdict.rule == "seqlen_q_domain" and verdict.message == "kernel 'sm120_decode' runs seqlen_q in [1, 16], got 4096"
    assert check_forward(cfg, ProblemClass(128, 128, False, 4), TARGET, kernels).rule == "gqa_supported"
    assert check_forward(cfg, ProblemClass(256, 256, False), TARGET, kernels).rule == "head_dim_domain"



def test_a_proposer_sees_the_class_and_names_its_knob_only_for_its_configs(agent):
    from search.proposing.prompt import system_prompt, tool
    from search.proposing.proposer import Context, Proposal, check_proposals

    context = Context(get_space("fwd"), D64, [Problem(1, 1024, 1024, 8, 8, 64, 64, False)], TARGET, [], k=2)
    base = {"tile_m": 64, "tile_n": 64, "num_threads": 128, "num_stages": 1, "Q_in_regs": False}
    checked = check_proposals([Proposal({**base, "kernel": "sm120"}, "upstream's"),
                               Proposal({**base, "kernel": "sm120_spare"}, "no spare_kb")], context)
    assert [c for c, _ in checked.accepted] == [ForwardConfig(64, 64)]
    assert [r.reason for r in checked.rejected] == ["missing knob 'spare_kb'"]
    schema = tool(context)["input_schema"]["properties"]["proposals"]["items"]["properties"]["config"]
    assert schema["properties"]["spare_kb"] == {"enum": [1, 2]} and "spare_kb" not in schema["required"]
    assert "- sm120_spare: Upstream's SM120 forward with `spare_kb` KB of shared memory it does not use; own knobs: spare_kb" in system_prompt(context)
