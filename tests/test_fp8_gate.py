"""The FP8 accuracy gate (fa4tune/harness/fp8_gate.py, issue 45) on the CPU: the reference quantizer (fa4tune/fp8.py)
passes it on normal and outlier inputs, and on large-magnitude channels only with K smoothed; a wrong scale, a scaled
output, a wrong LSE and a NaN fail it naming the rule, the worst value and the head; the quantizer's error is e4m3's;
smoothing K changes no output and its LSE correction is exact; the outlier inputs are FlashAttention-3's."""

import math

import pytest
import torch

from fa4tune import fp8
from fa4tune.config import Problem
from fa4tune.harness import fp8_gate, gate

torch.set_num_threads(1)


def _case(causal: bool, outliers: bool, seed: int = 0, d: int = 64):
    shapes = [(1, 384, 4, d), (1, 384, 2, d), (1, 384, 2, d)]  # GQA 2, partial last tiles (384 = 3 x 128 = 6 x 64)
    generator = torch.Generator().manual_seed(seed)
    if outliers:
        q, k, v = fp8_gate.outlier_inputs(shapes, torch.bfloat16, generator)
    else:
        q, k, v = (torch.randn(s, generator=generator).to(torch.bfloat16) for s in shapes)
    ref = gate.reference_attention(q, k, v, causal)
    qq, qs = fp8.quantize_per_tile(q, 128)
    kq, ks = fp8.quantize_per_tile(k, 64)
    return q, k, v, ref, (qq, qs), (kq, ks)


def _fp8_attention(q8, k8, v, causal, k_scale_change=None):
    (qq, qs), (kq, ks) = q8, k8
    if k_scale_change is not None:
        ks = k_scale_change(ks.clone())
    return gate.reference_attention(fp8.dequantize_per_tile(qq, qs, 128), fp8.dequantize_per_tile(kq, ks, 64), v, causal)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("outliers", [False, True])
def test_the_reference_quantizer_passes_the_gate(causal, outliers):
    q, k, v, ref, q8, k8 = _case(causal, outliers)
    fp8 = _fp8_attention(q8, k8, v, causal)
    result = fp8_gate.check(fp8.out, fp8.lse, ref.out, ref.lse)
    assert result.passed, result.reason
    assert 0.005 < result.rel_l2 < fp8_gate.REL_L2_MAX and fp8_gate.COS_MIN < result.cos < 0.99999  # e4m3's error, not 0


def test_a_wrong_k_scale_fails_naming_the_rule_the_value_and_the_head():
    q, k, v, ref, q8, k8 = _case(True, False)

    def double_one_tile(ks):
        ks[0, 1, 2] *= 2  # batch 0, KV head 1 (query heads 2 and 3), keys 128-191
        return ks

    wrong = _fp8_attention(q8, k8, v, True, double_one_tile)
    result = fp8_gate.check(wrong.out, wrong.lse, ref.out, ref.lse)
    assert not result.passed and result.rel_l2 > 0.3
    assert "relative L2 error" in result.reason and f"> {fp8_gate.REL_L2_MAX}" in result.reason
    assert "(batch 0, head 2)" in result.reason or "(batch 0, head 3)" in result.reason


def test_an_output_off_by_25_percent_a_wrong_lse_and_a_nan_fail():
    q, k, v, ref, q8, k8 = _case(False, False)
    fp8 = _fp8_attention(q8, k8, v, False)
    scaled = fp8_gate.check(fp8.out * 1.25, fp8.lse, ref.out, ref.lse)
    assert not scaled.passed and "relative L2 error" in scaled.reason
    shifted = fp8_gate.check(fp8.out, fp8.lse + 0.1 * fp8.lse.abs().mean(), ref.out, ref.lse)
    assert not shifted.passed and "LSE relative L2 error" in shifted.reason
    poisoned = fp8.out.clone()
    poisoned[0, 5, 1, 3] = math.nan
    assert fp8_gate.check(poisoned, fp8.lse, ref.out, ref.lse).reason == "NaN in the output"
    # what the gate cannot see: an FP8 output 5 % off is inside e4m3's own error (documented, not a silent pass)
    assert fp8_gate.check(fp8.out * 1.05, fp8.lse, ref.out, ref.lse).passed


def test_the_quantizer_keeps_e4m3_precision_per_tile_and_zero_tiles():
    x = torch.randn(2, 200, 3, 64, generator=torch.Generator().manual_seed(3))
    x[1, 128:, 2] = 0  # a tile of zeros: scale 1, values 0
    values, scale = fp8.quantize_per_tile(x, 128)
    assert values.dtype == torch.float8_e4m3fn and values.shape == x.shape and scale.shape == (2, 3, 2)
    assert scale[1, 2, 1] == 1 and torch.all(values[1, 128:, 2].float() == 0)
    back = fp8.dequantize_per_tile(values, scale, 128)
    normal = x.abs() > scale.permute(0, 2, 1).repeat_interleave(128, 1)[:, :200, :, None] * 2.0**-6  # e4m3 normal range
    rel = ((back - x).abs() / x.abs())[normal]
    assert rel.max() <= 2.0**-4 + 1e-6  # round to nearest with 3 mantissa bits
    tile_amax = x[0, :128, 0].abs().max()
    assert torch.isclose(scale[0, 0, 0], tile_amax / fp8.FP8_MAX)


def test_large_channels_pass_only_with_k_smoothed_and_smoothing_is_exact_in_fp32():
    shapes = [(1, 384, 4, 64), (1, 384, 2, 64), (1, 384, 2, 64)]
    q, k, v = fp8_gate.channel_outlier_inputs(*shapes, torch.bfloat16, torch.Generator().manual_seed(0))
    ref = gate.reference_attention(q, k, v, True)
    smoothed, mean = fp8.smooth_k(k)
    assert mean.shape == (1, 2, 64) and mean.abs().max() > 5  # the channels' offsets
    exact = gate.reference_attention(q.float(), smoothed, v, True)  # no quantization: out the same, LSE shifted
    assert torch.allclose(exact.out, ref.out, atol=2e-5)
    assert torch.allclose(exact.lse + fp8.lse_correction(q, mean, 1 / 8), ref.lse, atol=1e-3)
    qd = fp8.dequantize_per_tile(*fp8.quantize_per_tile(q, 128), 128)
    for k_in, lse_shift, passes in ((k, 0, False), (smoothed, fp8.lse_correction(q, mean, 1 / 8), True)):
        kd = fp8.dequantize_per_tile(*fp8.quantize_per_tile(k_in, 64), 64)
        got = gate.reference_attention(qd, kd, v, True)
        result = fp8_gate.check(got.out, got.lse + lse_shift, ref.out, ref.lse)
        assert result.passed is passes, result


def test_the_outlier_inputs_are_flashattention_3s():
    (x,) = fp8_gate.outlier_inputs([(1, 4096, 8, 128)], torch.float32, torch.Generator().manual_seed(0))
    base = torch.randn(1, 4096, 8, 128, generator=torch.Generator().manual_seed(0))
    hits = (x - base).abs() > 0
    assert 0.0007 < hits.float().mean().item() < 0.0013  # 0.1 % of the entries
    assert 7 < (x - base)[hits].std().item() < 13  # N(0, 10^2) added there


def test_the_accuracy_table_runs_on_a_small_suite(tmp_path, capsys):
    import json

    from bench import fp8_accuracy

    suite = tmp_path / "tiny.json"
    rows = [Problem(1, 320, 320, 4, 1, 64, 64, True, name="tiny gqa4 causal"), Problem(1, 8, 320, 4, 4, 64, 64, False, name="a decode")]
    suite.write_text(json.dumps({"problems": [{**p.to_dict(), "name": p.name} for p in rows]}))
    assert fp8_accuracy.main(["--suites", str(suite), "--heads", "4"]) == 0
    out = capsys.readouterr().out
    assert "| tiny gqa4 causal | normal | 4 |" in out and "| tiny gqa4 causal | outliers | 4 |" in out
    assert "a decode" not in out and "3 of 3 pass the FP8 gate" in out and "| tiny gqa4 causal | channels | 4 |" in out


def test_the_accuracy_table_refuses_an_unknown_input_kind_naming_the_known_ones(capsys):
    from bench import fp8_accuracy

    with pytest.raises(SystemExit) as done:
        fp8_accuracy.main(["--inputs", "normal,spiky"])
    assert done.value.code == 2 and "--inputs: each of normal, outliers, channels, got 'normal,spiky'" in capsys.readouterr().err


# -- the gate applied by the harness to an "fp8" problem (precision "fp8") ------------------------------------------

FP8_PROBLEM = Problem(1, 256, 256, 4, 2, 64, 64, True, "fp8", backward=False)


def fp8_forward(q, k, v, causal, **_):
    """What the FP8 kernel computes, on the CPU: fp32 attention on the dequantized e4m3 tiles, the LSE corrected."""
    config, scale = fp8.default_config(q.shape[-1]), q.shape[-1] ** -0.5
    qq, qs, kq, ks, correction = fp8.quantize_inputs(q, k, config, scale)
    ref = gate.reference_attention(fp8.dequantize_per_tile(qq, qs, config.tile_m), fp8.dequantize_per_tile(kq, ks, config.tile_n),
                                   v, causal)
    return ref.out.to(torch.bfloat16), ref.lse + correction


def test_an_fp8_problem_is_gated_on_the_fp8_gate_s_input_kinds_too():
    cases = gate.gate_cases(FP8_PROBLEM, 7)
    assert [(c.variant, c.kind) for c in cases if c.kind != "normal"] == [("fp8 outliers", "outliers"), ("fp8 channels", "channels")]
    assert all(c.kind == "normal" for c in gate.gate_cases(Problem(1, 256, 256, 4, 2, 64, 64, True, "bf16"), 7))
    assert not [c for c in cases if c.scale != 1.0]  # no x8 inputs: the FP8 gate is stated for unit-scale ones


@pytest.mark.parametrize("head_dim, causal", [(64, True), (128, False), (128, True)])
def test_what_an_fp8_kernel_computes_passes_every_gate_case_of_its_problem(head_dim, causal):
    """The quantizer's own error, on the harness's gate cases for an fp8 problem (normal, odd lengths, random shapes,
    outliers, large channels): a correct FP8 kernel is not refused. At x8 inputs it would be (relative L2 0.25-0.30)."""
    problem = Problem(1, 512, 512, 4, 2, head_dim, head_dim, causal, "fp8", backward=False)
    for case in gate.gate_cases(problem, 5):
        q, k, v = gate.random_inputs(case.problem, case.seed, "cpu", scale=case.scale, kind=case.kind)
        result = gate.check_outputs(q, k, v, causal, *fp8_forward(q, k, v, causal), variant=case.variant, precision="fp8")
        assert result.passed, result.reason
    q, k, v = (8 * t for t in gate.random_inputs(problem, 5, "cpu"))
    assert not gate.check_outputs(q, k, v, causal, *fp8_forward(q, k, v, causal), precision="fp8").passed
    q, k, v = gate.random_inputs(FP8_PROBLEM, 1, "cpu", kind="outliers")
    assert q.dtype == torch.bfloat16 and q.abs().max() > 10  # FA3's N(0, 100) outliers among normal values
    q, k, v, dout = gate.random_inputs(FP8_PROBLEM, 1, "cpu", count=4, kind="channels")
    assert dout.shape == q.shape and (k.float().mean(dim=1).abs().amax(dim=-1) > 3).all()  # K's offset channels


@pytest.mark.parametrize("kind", ["normal", "outliers", "channels"])
def test_the_fp8_rule_passes_e4m3_outputs_that_the_bf16_rule_refuses(kind):
    q, k, v = gate.random_inputs(FP8_PROBLEM, 3, "cpu", kind=kind)
    out, lse = fp8_forward(q, k, v, True)
    assert gate.check_outputs(q, k, v, True, out, lse, precision="fp8").passed
    assert not gate.check_outputs(q, k, v, True, out, lse).passed  # e4m3's error is not bf16's
    wrong = gate.check_outputs(q, k, v, True, out * 1.25, lse, precision="fp8")
    assert not wrong.passed and "fp8 gate: relative L2 error" in wrong.reason


def test_the_run_time_guards_check_an_fp8_forward_s_rows_by_the_fp8_rule():
    from fa4tune.harness import runtime_guards

    runtime_guards.check_forward_reuse(fp8_forward, FP8_PROBLEM, torch.device("cpu"), 11, runtime_guards.sync_for("cpu"))
    with pytest.raises(runtime_guards.GuardViolation, match="fp8 gate"):
        runtime_guards.check_forward_reuse(lambda q, k, v, causal, **_: (fp8_forward(q, k, v, causal)[0] * 1.25, None),
                                           FP8_PROBLEM, torch.device("cpu"), 11, runtime_guards.sync_for("cpu"))
