import pytest

from fa4tune.config import BackwardConfig, ConfigError, ForwardConfig, Problem, ProblemClass


def test_forward_config_round_trip_and_key_has_every_knob():
    cfg = ForwardConfig(tile_m=128, tile_n=96, num_threads=256, num_stages=2, Q_in_regs=True)
    assert ForwardConfig.from_dict(cfg.to_dict()) == cfg
    key = cfg.key()
    assert key == ("ForwardConfig", 128, 96, 256, 2, True, "sm120")
    assert ForwardConfig(**{**cfg.to_dict(), "num_stages": 1}).key() != key


def test_unknown_knob_is_named():
    with pytest.raises(ConfigError) as err:
        BackwardConfig(m_block_size=64, tile_k=64)
    assert err.value.rule == "unknown_knob"
    assert "'tile_k'" in str(err.value) and "extra={...}" in str(err.value)


def test_a_backward_config_carries_its_kernel_class_and_its_own_knobs_and_stays_as_stored_for_upstreams():
    from fa4tune.feasibility import check_backward
    from fa4tune.targets import get_target

    # as stored before backward classes existed: no `kernel` in the dict while it is upstream's class
    assert "kernel" not in BackwardConfig().to_dict() and BackwardConfig.from_dict(BackwardConfig().to_dict()) == BackwardConfig()
    cfg = BackwardConfig.from_dict({"m_block_size": 64, "kernel": "sm120_x", "split_dq": True})
    assert cfg.extra_knobs == {"split_dq": True} and cfg.to_dict()["kernel"] == "sm120_x"
    assert BackwardConfig.from_dict(cfg.to_dict()) == cfg and cfg.key() != BackwardConfig(kernel="sm120_x").key()
    pc = ProblemClass(128, 128, True)
    assert check_backward(cfg, pc, get_target()).rule == "kernel_known"
    verdict = check_backward(BackwardConfig.from_dict({"tile_k": 64}), pc, get_target())
    assert verdict.rule == "kernel_knobs" and "has no knob 'tile_k'" in verdict.message


def test_a_forward_config_carries_its_kernel_class_own_knobs_flat():
    # which knobs a kernel class has is feasibility's rule (kernel_knobs, tests/test_kernel_protocol.py), not the record's
    cfg = ForwardConfig.from_dict({"tile_m": 64, "kernel": "sm120_x", "spare_kb": 2, "swizzle": "wide"})
    assert cfg.extra_knobs == {"spare_kb": 2, "swizzle": "wide"} and cfg == ForwardConfig(64, kernel="sm120_x", extra={"swizzle": "wide", "spare_kb": 2})
    assert cfg.to_dict() == {**ForwardConfig(64, kernel="sm120_x").to_dict(), "spare_kb": 2, "swizzle": "wide"}
    assert ForwardConfig.from_dict(cfg.to_dict()) == cfg and hash(cfg) == hash(ForwardConfig.from_dict(cfg.to_dict()))
    assert cfg.key()[-2:] == (("spare_kb", 2), ("swizzle", "wide")) and cfg.short().endswith("kernel=sm120_x spare_kb=2 swizzle=wide")
    assert ForwardConfig().key() == ("ForwardConfig", 128, 64, 128, 1, False, "sm120")  # no own knobs: the key as before
    with pytest.raises(ConfigError) as err:
        ForwardConfig.from_dict({"kernel": "sm120_x", "spare_kb": [1, 2]})
    assert err.value.rule == "knob_type" and "spare_kb" in str(err.value)


@pytest.mark.parametrize("knob,value", [("tile_m", "128"), ("Q_in_regs", 1), ("num_threads", True), ("tile_n", 64.0)])
def test_wrong_type_is_named(knob, value):
    with pytest.raises(ConfigError) as err:
        ForwardConfig.from_dict({knob: value})
    assert err.value.rule == "knob_type"
    assert knob in str(err.value) and repr(value) in str(err.value)


def test_backward_knob_names_match_upstream_constructor():
    import inspect

    from flash_attn.cute.flash_bwd_sm120 import FlashAttentionBackwardSm120

    params = inspect.signature(FlashAttentionBackwardSm120.__init__).parameters
    for name in BackwardConfig().to_dict():
        assert name in params, name


def test_forward_knob_names_match_upstream_constructor():
    import inspect

    from flash_attn.cute.flash_fwd import FlashAttentionForwardBase

    params = inspect.signature(FlashAttentionForwardBase.__init__).parameters
    for name in ForwardConfig().to_dict():
        if name != "kernel":  # ours: which kernel class runs the config
            assert name in params, name


@pytest.mark.parametrize("head_dim", [100, 0, -8, 12])
def test_head_dim_must_be_multiple_of_8(head_dim):
    with pytest.raises(ConfigError) as err:
        ProblemClass(head_dim, 128, False)
    assert err.value.rule == "head_dim_multiple_of_8"
    assert str(head_dim) in str(err.value)


def test_dtype_must_be_fp16_or_bf16():
    with pytest.raises(ConfigError) as err:
        ProblemClass(128, 128, False, dtype="fp32")
    assert err.value.rule == "dtype" and "'fp32'" in str(err.value)


def test_problem_class_name_round_trip():
    for pc in [ProblemClass(128, 128, True, 4), ProblemClass(64, 64, False), ProblemClass(192, 128, False, dtype="fp16")]:
        assert ProblemClass.parse(pc.name) == pc
    with pytest.raises(ConfigError):
        ProblemClass.parse("garbage")


def test_problem_gqa_ratio_and_class():
    p = Problem(1, 2048, 2048, 32, 8, 128, 128, True)
    assert p.problem_class == ProblemClass(128, 128, True, 4)
    with pytest.raises(ConfigError) as err:
        Problem(1, 2048, 2048, 32, 6, 128, 128, True)
    assert err.value.rule == "gqa_ratio"
