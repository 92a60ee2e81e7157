"""experiment.py's dispatch tables cover every problem class of the shipped suites with feasible configs."""

import experiment
from fa4tune.config import BackwardConfig, ForwardConfig, ProblemClass
from fa4tune.defaults import upstream_backward, upstream_forward
from fa4tune.feasibility import check_backward, check_forward
from fa4tune.suites import load_suite, problem_classes, suite_names
from fa4tune.targets import get_target

TARGET = get_target("sm120")


def test_every_suite_problem_class_has_a_feasible_table_entry():
    assert {"standard", "quick"} <= set(suite_names())
    for name in suite_names():
        problems = load_suite(name)
        for pc in problem_classes(problems):
            assert pc.name in experiment.FORWARD_DISPATCH, (name, pc.name)
            fwd = experiment.forward_config(pc)
            assert fwd is experiment.FORWARD_DISPATCH[pc.name]
            assert check_forward(fwd, pc, TARGET), (pc.name, check_forward(fwd, pc, TARGET))
            if any(p.backward and p.problem_class == pc for p in problems):
                assert pc.name in experiment.BACKWARD_DISPATCH, (name, pc.name)
                bwd = experiment.backward_config(pc)
                assert check_backward(bwd, pc, TARGET), (pc.name, check_backward(bwd, pc, TARGET))


def test_table_keys_are_problem_class_names_and_values_configs():
    for name, cfg in experiment.FORWARD_DISPATCH.items():
        assert ProblemClass.parse(name).name == name and isinstance(cfg, ForwardConfig)
    for name, cfg in experiment.BACKWARD_DISPATCH.items():
        assert ProblemClass.parse(name).name == name and isinstance(cfg, BackwardConfig)


def test_unlisted_class_falls_back_to_upstream_defaults():
    pc = ProblemClass(256, 256, True, 2, "fp16")
    assert pc.name not in experiment.FORWARD_DISPATCH
    assert experiment.forward_config(pc) == upstream_forward(pc)
    assert experiment.backward_config(pc) == upstream_backward(pc)


def test_kernel_class_registry():
    from flash_attn.cute.flash_bwd_sm120 import FlashAttentionBackwardSm120
    from flash_attn.cute.flash_fwd_sm120 import FlashAttentionForwardSm120

    from kernels.tma_forward_sm120 import TmaForwardSm120
    from kernels.tuned_forward_sm120 import TunedForwardSm120

    assert experiment.kernel_class(ForwardConfig()) is TunedForwardSm120
    assert experiment.kernel_class(ForwardConfig(kernel="sm120_tma")) is TmaForwardSm120
    assert experiment.kernel_class(BackwardConfig()) is experiment.TunedBackwardSm120
    assert issubclass(TunedForwardSm120, FlashAttentionForwardSm120)
    assert issubclass(experiment.TunedBackwardSm120, FlashAttentionBackwardSm120)
