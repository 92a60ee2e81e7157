"""The correctness gate on CPU tensors: the fp32 reference, the pass rule, and what must fail."""

import math
import re

import pytest
import torch

from fa4tune.config import Problem
from fa4tune.harness import gate
from prepare_child_targets import torch_attention

# Tiny CPU matmuls run ~1000x slower on two contended threads than on one.
torch.set_num_threads(1)

GQA_CAUSAL = Problem(2, 40, 72, 4, 2, 32, 32, True)  # sq != sk: bottom-right causal alignment matters


def inputs(problem=GQA_CAUSAL, seed=0, scale=1.0):
    return gate.random_inputs(problem, seed, "cpu", scale=scale, count=4)


def correct(q, k, v, causal):
    return torch_attention(q, k, v, causal, return_lse=True)


def naive_float64(q, k, v, causal):
    """Attention in float64, one (batch, head) at a time: the reference's reference."""
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    out = torch.zeros(b, sq, hq, v.shape[-1], dtype=torch.float64)
    lse = torch.zeros(b, hq, sq, dtype=torch.float64)
    for bi in range(b):
        for h in range(hq):
            kv = h // (hq // hkv)
            s = q[bi, :, h].double() @ k[bi, :, kv].double().T / math.sqrt(d)
            if causal:
                for i in range(sq):
                    s[i, i + sk - sq + 1:] = -math.inf
            lse[bi, h] = torch.logsumexp(s, -1)
            out[bi, :, h] = torch.softmax(s, -1) @ v[bi, :, kv].double()
    return out, lse


@pytest.mark.parametrize("causal", [False, True])
def test_reference_matches_float64_with_gqa_and_bottom_right_causal(causal):
    q, k, v, _ = inputs()
    ref = gate.reference_attention(q, k, v, causal)
    out, lse = naive_float64(q, k, v, causal)
    assert (ref.out.double() - out).abs().max() < 1e-5
    assert (ref.lse.double() - lse).abs().max() < 1e-5


def test_chunked_reference_equals_the_whole_one_including_gradients():
    q, k, v, dout = inputs()
    whole = gate.reference_attention(q, k, v, True, dout=dout)
    rows = 8  # five chunks of query rows per batch, each with its own causal key limit
    chunked = gate.reference_attention(q, k, v, True, dout=dout, chunk_bytes=rows * 4 * 72 * 4 * gate._INTERMEDIATES)
    for name in ("out", "lse", "dq", "dk", "dv"):
        assert torch.allclose(getattr(whole, name), getattr(chunked, name), atol=1e-5), name
    # gradients agree with autograd through a plain implementation (GQA: dK, dV summed over the group)
    q2, k2, v2 = (t.detach().requires_grad_() for t in (q, k, v))
    out, _ = torch_attention(q2, k2, v2, True, return_lse=True)
    dq, dk, dv = torch.autograd.grad(out.float(), (q2, k2, v2), dout.float())
    for ours, theirs in ((whole.dq, dq), (whole.dk, dk), (whole.dv, dv)):
        assert (ours.float() - theirs.float()).abs().max() < 0.02


def test_rows_that_see_no_key_have_zero_output_and_are_left_out_of_the_lse_check():
    q, k, v, _ = inputs(Problem(1, 12, 5, 2, 2, 16, 16, True))  # sq > sk: the first 7 rows see nothing
    ref = gate.reference_attention(q, k, v, True)
    assert torch.all(ref.out[:, :7] == 0)
    assert torch.all(torch.isinf(ref.lse[:, :, :7]))
    assert ref.valid_rows[0, 0].tolist() == [False] * 7 + [True] * 5


def test_atol_is_upstreams_rounding_term():
    ref = torch.tensor([1.0, -3.0, 0.001])
    r = ref.to(torch.bfloat16)
    expected = 2 * ((r + 0.3 - 0.3) - r).abs().max().item()
    assert gate.low_precision_atol(ref, torch.bfloat16) == expected > 0


@pytest.mark.parametrize("causal", [False, True])
def test_a_correct_kernel_passes_forward_and_backward(causal):
    q, k, v, dout = inputs()
    fwd = gate.gate_forward(correct, q, k, v, causal)
    assert fwd.passed, fwd.reason
    assert [c.name for c in fwd.checks] == ["out", "lse"]
    bwd = gate.gate_backward(correct, q, k, v, causal, dout)
    assert bwd.passed, bwd.reason
    assert [c.name for c in bwd.checks] == ["out", "lse", "dq", "dk", "dv"]
    for check in bwd.checks:
        assert check.error <= check.tolerance == pytest.approx(gate.RTOL * check.plain_error + check.atol)


def test_a_planted_wrong_element_fails_and_the_reason_has_the_numbers():
    def planted(q, k, v, causal):
        out, lse = correct(q, k, v, causal)
        out = out.clone()
        out[1, 3, 2, 5] += 0.5
        return out, lse

    result = gate.gate_forward(planted, *inputs()[:3], True, variant="normal")
    assert not result.passed
    assert re.fullmatch(
        r"normal \(b2 sq40 sk72 hq4/hkv2 d32 causal\): out max error 0\.[45]\d* > tolerance 0\.\d+ "
        r"\(2 x plain PyTorch error 0\.\d+ \+ atol 0\.\d+\)", result.reason,
    ), result.reason
    assert result.max_errors()["out"] == pytest.approx(0.5, abs=0.02)


def test_a_wrong_lse_fails():
    def bad_lse(q, k, v, causal):
        out, lse = correct(q, k, v, causal)
        return out, lse + 0.1

    result = gate.gate_forward(bad_lse, *inputs()[:3], False)
    assert not result.passed and "lse max error" in result.reason


def test_nan_anywhere_fails():
    def one_nan(q, k, v, causal):
        out, lse = correct(q, k, v, causal)
        out = out.clone()
        out[0, 0, 0, 0] = float("nan")
        return out, lse

    result = gate.gate_forward(one_nan, *inputs()[:3], True)
    assert not result.passed
    assert "1 of" in result.reason and "NaN" in result.reason


def test_unwritten_elements_of_a_prefilled_output_fail():
    seen = {}

    def writes_half(q, k, v, causal, out, lse):
        seen["prefilled"] = bool(torch.isnan(out).all() and torch.isnan(lse).all())
        full, full_lse = correct(q, k, v, causal)
        out[:, : out.shape[1] // 2] = full[:, : out.shape[1] // 2]  # forgets the second half of the rows
        lse.copy_(full_lse)

    writes_half.accepts_out = True
    result = gate.gate_forward(writes_half, *inputs()[:3], True)
    assert seen["prefilled"]
    assert not result.passed
    assert "never written" in result.reason

    def writes_all(q, k, v, causal, out, lse):
        full, full_lse = correct(q, k, v, causal)
        out.copy_(full)
        lse.copy_(full_lse)

    writes_all.accepts_out = True
    assert gate.gate_forward(writes_all, *inputs()[:3], True).passed


class _PoisonedAllocator:
    """A stand-in for the CUDA caching allocator on the CPU: after gate.poison_cuda_allocator's call, the next blocks
    it hands out read as NaN (what 0xFF bytes are in fp32/bf16), before it they read as 0 (what a fresh block may)."""

    def __init__(self, monkeypatch):
        self.poisoned, self.sizes = False, []
        monkeypatch.setattr(gate, "poisons", lambda device: True)
        monkeypatch.setattr(gate, "poison_cuda_allocator", self.poison)

    def poison(self, nbytes, device):
        self.poisoned, self.sizes = True, list(nbytes)

    def empty_like(self, t):
        return torch.full_like(t, float("nan") if self.poisoned else 0.0)


def test_unwritten_elements_of_a_candidates_own_output_fail(monkeypatch):
    # the path experiment candidates take (no out=): the allocator is poisoned right before the call, so rows the
    # kernel never writes in its own allocation read as NaN; without the poisoning they read as 0 and would pass
    # as masked rows
    allocator = _PoisonedAllocator(monkeypatch)

    def writes_half(q, k, v, causal):
        full, full_lse = correct(q, k, v, causal)
        out = allocator.empty_like(full)
        out[:, : out.shape[1] // 2] = full[:, : out.shape[1] // 2]  # forgets the second half of the rows
        return out, full_lse

    q, k, v = inputs()[:3]
    result = gate.gate_forward(writes_half, q, k, v, True)
    assert not result.passed and "never written" in result.reason
    assert allocator.sizes == [q.numel() // q.shape[-1] * v.shape[-1] * q.element_size(), q.shape[0] * q.shape[2] * q.shape[1] * 4]


def test_gradients_a_backward_never_writes_fail(monkeypatch):
    allocator = _PoisonedAllocator(monkeypatch)

    class WritesNoDQ(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            ctx.save_for_backward(q, k, v)
            return correct(q, k, v, True)[0]

        @staticmethod
        def backward(ctx, dout):
            q, k, v = ctx.saved_tensors
            with torch.enable_grad():
                qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
                _, dk, dv = torch.autograd.grad(correct(qq, kk, vv, True)[0], (qq, kk, vv), dout)
            return allocator.empty_like(q), dk, dv  # dq allocated, never written

    q, k, v, dout = inputs()
    result = gate.gate_backward(lambda q, k, v, c: (WritesNoDQ.apply(q, k, v), None), q, k, v, True, dout)
    assert not result.passed and result.reason.split(": ", 1)[1].startswith("dq: ") and "never written" in result.reason


def test_a_wrong_gradient_fails_naming_the_tensor():
    class ScaledDQ(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q):
            return q.view_as(q)

        @staticmethod
        def backward(ctx, grad):
            return grad * 1.25

    def bad_dq(q, k, v, causal):
        return correct(ScaledDQ.apply(q), k, v, causal)

    q, k, v, dout = inputs()
    result = gate.gate_backward(bad_dq, q, k, v, True, dout)
    assert not result.passed
    failing = [c.name for c in result.checks if not c.passed]
    assert failing == ["dq"]


def test_a_wrong_shape_fails():
    def transposed(q, k, v, causal):
        out, lse = correct(q, k, v, causal)
        return out.transpose(1, 2), lse

    result = gate.gate_forward(transposed, *inputs()[:3], False)
    assert not result.passed and "shape" in result.reason


def test_gate_cases_cover_scale_odd_lengths_and_random_problems_of_the_same_class():
    problem = Problem(1, 8192, 8192, 32, 8, 128, 128, True, name="gqa prefill 8k")
    cases = gate.gate_cases(problem, seed=1234)
    variants = [c.variant for c in cases]
    assert variants[:3] == ["normal", "scaled x8", "seqlen-37"]
    assert cases[1].scale == 8.0
    odd = cases[2].problem
    assert (odd.seqlen_q, odd.seqlen_k) == (8155, 8155) and odd.seqlen_k % 16
    randoms = cases[3:]
    assert len(randoms) == 2 and all(c.variant == f"random seed={c.seed}" for c in randoms)
    assert all(c.problem.problem_class == problem.problem_class for c in cases)
    assert all(c.problem.seqlen_q <= c.problem.seqlen_k <= 1024 for c in randoms)
    # the seed decides everything: the same seed draws the same problems, another seed others
    assert gate.gate_cases(problem, seed=1234) == cases
    assert gate.gate_cases(problem, seed=4321)[3:] != randoms


def test_decode_cases_keep_one_query_token():
    decode = Problem(1, 1, 4096, 32, 8, 128, 128, False, backward=False)
    assert all(c.problem.seqlen_q == 1 for c in gate.gate_cases(decode, seed=5))


def test_scaled_inputs_are_scaled_and_never_zero():
    q, k, v, dout = gate.random_inputs(GQA_CAUSAL, 3, "cpu", scale=8.0, count=4)
    q1, *_ = gate.random_inputs(GQA_CAUSAL, 3, "cpu", count=4)
    assert torch.allclose(q.float(), (q1.float() * 8), rtol=1e-2)
    assert q.abs().max() > 8 and (q != 0).float().mean() > 0.99
    assert dout.abs().max() < 8  # the output gradient is not scaled


# ------------------------------------------------------------------------------------------------
# The reference cache: a later candidate on the same case reuses the references.
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def reference_calls(monkeypatch):
    calls = []
    compute = gate.reference_attention

    def counting(q, k, v, causal, *args, **kwargs):
        calls.append((tuple(q.shape), kwargs.get("dtype", torch.float32), kwargs.get("dout") is not None))
        return compute(q, k, v, causal, *args, **kwargs)

    monkeypatch.setattr(gate, "reference_attention", counting)
    return calls


def wrong(q, k, v, causal):
    out, lse = correct(q, k, v, causal)
    return out * 1.5, lse


def test_a_second_candidate_on_the_same_case_reuses_the_references(reference_calls):
    cache = gate.ReferenceCache(1 << 30)
    q, k, v, _ = inputs(seed=5)
    first = gate.gate_forward(correct, q, k, v, True, seed=5, references=cache)
    assert len(reference_calls) == 2  # fp32 and plain
    # the inputs regenerated from their seed (as the harness does for each candidate)
    q, k, v, _ = inputs(seed=5)
    second = gate.gate_forward(wrong, q, k, v, True, seed=5, references=cache)
    again = gate.gate_forward(correct, q, k, v, True, seed=5, references=cache)
    assert len(reference_calls) == 2 and cache.hits == 2
    assert not second.passed and "out max error" in second.reason  # a kept reference still catches a wrong kernel
    assert again.checks == first.checks
    uncached = gate.gate_forward(correct, q, k, v, True, seed=5)
    assert uncached.checks == first.checks and len(reference_calls) == 4


def test_another_seed_scale_shape_direction_or_mask_misses(reference_calls):
    cache = gate.ReferenceCache(1 << 30)
    q, k, v, dout = inputs(seed=5)
    gate.gate_forward(correct, q, k, v, True, seed=5, references=cache)
    gate.gate_forward(correct, *inputs(seed=6)[:3], True, seed=6, references=cache)
    gate.gate_forward(correct, *inputs(seed=5, scale=8.0)[:3], True, seed=5, input_scale=8.0, references=cache)
    other_shape = Problem(2, 40, 72, 4, 2, 64, 64, True)  # other head dims
    gate.gate_forward(correct, *inputs(other_shape, seed=5)[:3], True, seed=5, references=cache)
    gate.gate_forward(correct, q, k, v, False, seed=5, references=cache)
    gate.gate_backward(correct, q, k, v, True, dout, seed=5, references=cache)
    assert cache.hits == 0 and cache.misses == 6 and len(reference_calls) == 12 and len(cache) == 6
    assert [c[2] for c in reference_calls[-2:]] == [True, True]  # the backward's references have gradients
    gate.gate_backward(correct, q, k, v, True, dout, seed=5, references=cache)
    assert cache.hits == 1 and len(reference_calls) == 12


def test_a_mislabelled_input_is_not_given_another_inputs_references(reference_calls):
    cache = gate.ReferenceCache(1 << 30)
    gate.gate_forward(correct, *inputs(seed=5)[:3], True, seed=5, references=cache)
    # other values under the same seed and scale (a caller's mistake): the sampled input values differ
    result = gate.gate_forward(correct, *inputs(seed=9)[:3], True, seed=5, references=cache)
    assert cache.misses == 2 and result.passed


def test_the_cache_drops_the_least_recently_used_beyond_its_bytes(reference_calls):
    q, k, v, _ = inputs(seed=5)
    probe = gate.ReferenceCache(1 << 30)
    gate.gate_forward(correct, q, k, v, True, seed=5, references=probe)
    one = probe.bytes
    cache = gate.ReferenceCache(2 * one)
    for seed in (5, 6, 5, 7):  # 5 is used again before 7 arrives: 6 is the one dropped
        gate.gate_forward(correct, *inputs(seed=seed)[:3], True, seed=seed, references=cache)
    assert len(cache) == 2 and cache.bytes == 2 * one and cache.hits == 1
    calls = len(reference_calls)
    gate.gate_forward(correct, *inputs(seed=5)[:3], True, seed=5, references=cache)
    assert len(reference_calls) == calls
    gate.gate_forward(correct, *inputs(seed=6)[:3], True, seed=6, references=cache)
    assert len(reference_calls) == calls + 2
    small = gate.ReferenceCache(one - 1)  # an entry larger than the whole cache is computed, not kept
    gate.gate_forward(correct, q, k, v, True, seed=5, references=small)
    assert len(small) == 0 and small.bytes == 0


def test_a_kept_reference_whose_bits_changed_is_computed_again(reference_calls):
    cache = gate.ReferenceCache(1 << 30)
    q, k, v, _ = inputs(seed=5)
    first = gate.gate_forward(correct, q, k, v, True, seed=5, references=cache)
    (ref, plain, *_), = cache._entries.values()
    ref.out[0, 0, 0, 0] += 1.0  # as a kernel writing out of bounds into the kept reference would
    again = gate.gate_forward(correct, q, k, v, True, seed=5, references=cache)
    assert cache.corrupted == 1 and len(reference_calls) == 4
    assert again.passed and again.checks == first.checks
