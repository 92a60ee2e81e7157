"""The fused FP8 quantization (fa4tune.fp8.fused_quantize, one Triton kernel per input; fused_quantize_v for V^T) against the torch functions
it replaces on a GPU: on the CPU through Triton's interpreter (values before the e4m3 cast, whose interpreter rounding
differs from the GPU's cvt near powers of two; scales and the LSE correction), on a GPU bit for bit."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fa4tune import fp8
from fa4tune.config import ForwardConfig

ROOT = Path(__file__).resolve().parent.parent
CASES = [(1, 200, 4, 1, 128, 64), (2, 130, 2, 2, 96, 96), (1, 77, 8, 2, 64, 128)]  # b, s, q heads, kv heads, d, tile

INTERPRETED = '''
import torch
from fa4tune import fp8

def before_cast(x, tile, scale):
    rows = scale.permute(0, 2, 1).repeat_interleave(tile, dim=1)[:, :x.shape[1]]
    return (x.float() / rows[..., None]).clamp(-448, 448)

torch.manual_seed(0)
for b, s, hq, hk, d, tile in %r:
    q = torch.randn(b, s, hq, d).bfloat16()
    k = (torch.randn(b, s, hk, d) + 3 * torch.randn(1, 1, hk, d)).bfloat16()  # an offset per channel: smoothing matters
    k_smoothed, mean = fp8.smooth_k(k)
    kv, ks, none = fp8.fused_quantize(k, tile, mean, smooth=True, raw=True)
    qv, qs, corr = fp8.fused_quantize(q[:, :, :, :].transpose(1, 2).contiguous().transpose(1, 2), tile, mean, smooth=False,
                                      softmax_scale=0.125, raw=True)  # strided rows
    (_, ref_ks), (_, ref_qs) = fp8.quantize_per_tile(k_smoothed, tile), fp8.quantize_per_tile(q, tile)
    assert none is None and torch.equal(ks, ref_ks) and torch.equal(qs, ref_qs), (b, s, d, tile)
    assert torch.equal(kv, before_cast(k_smoothed, tile, ref_ks)) and torch.equal(qv, before_cast(q, tile, ref_qs))
    assert torch.allclose(corr, fp8.lse_correction(q, mean, 0.125), rtol=0, atol=1e-5)
    v = k[..., : d // 2 + 32] * 4  # V's own width; tile 64 pads the keys to whole tiles
    amax = v.abs().amax(dim=1).float()
    vscale = torch.where(amax > 0, amax / 448, torch.ones_like(amax))
    padded = -(-s // 64) * 64
    vt = fp8.fused_quantize_v(v, vscale, padded, raw=True)
    ref = torch.nn.functional.pad((v.float() / vscale[:, None]).clamp(-448, 448), (0, 0, 0, 0, 0, padded - s))
    ref = ref[:, fp8.vt_keys(padded)]
    assert torch.equal(vt, ref.permute(0, 2, 3, 1)), (b, s, d)
print("interpreted ok")
''' % (CASES,)


def test_the_fused_kernel_computes_the_torch_quantizations_values_scales_and_correction_interpreted():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", INTERPRETED], capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert done.returncode == 0 and "interpreted ok" in done.stdout, (done.stdout + done.stderr)[-3000:]


def test_off_the_gpu_quantize_inputs_runs_the_torch_functions():
    q = torch.randn(1, 100, 4, 64).bfloat16()
    k = torch.randn(1, 100, 2, 64).bfloat16()
    config = ForwardConfig(tile_m=64, tile_n=64, num_threads=128, num_stages=2, Q_in_regs=False, kernel="sm120_fp8")
    qq, qs, kq, ks, corr = fp8.quantize_inputs(q, k, config, 0.125)
    k_smoothed, mean = fp8.smooth_k(k)
    assert torch.equal(qq.float(), fp8.quantize_per_tile(q, 64)[0].float()) and torch.equal(ks, fp8.quantize_per_tile(k_smoothed, 64)[1])
    assert torch.equal(corr, fp8.lse_correction(q, mean, 0.125))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the fused kernel's e4m3 cast needs a GPU")
@pytest.mark.parametrize("case", CASES)
def test_on_a_gpu_the_fused_quantization_equals_the_torch_one_bit_for_bit(case):
    b, s, hq, hk, d, tile = case
    torch.manual_seed(1)
    q = torch.randn(b, s, hq, d, device="cuda").bfloat16()
    k = (torch.randn(b, s, hk, d, device="cuda") + 3 * torch.randn(1, 1, hk, d, device="cuda")).bfloat16()
    config = ForwardConfig(tile_m=tile, tile_n=tile, num_threads=128, num_stages=1, Q_in_regs=False, kernel="sm120_fp8")
    qq, qs, kq, ks, corr = fp8.quantize_inputs(q, k, config, 0.125)
    k_smoothed, mean = fp8.smooth_k(k)
    (ref_kq, ref_ks), (ref_qq, ref_qs) = fp8.quantize_per_tile(k_smoothed, tile), fp8.quantize_per_tile(q, tile)
    assert torch.equal(ks, ref_ks) and torch.equal(qs, ref_qs)
    assert torch.equal(kq.view(torch.uint8), ref_kq.view(torch.uint8)) and torch.equal(qq.view(torch.uint8), ref_qq.view(torch.uint8))
    assert torch.allclose(corr, fp8.lse_correction(q, mean, 0.125), rtol=0, atol=1e-4)
    v = k * 4
    vt, vscale = fp8.quantize_v(v, tile)  # the fused kernel on a GPU
    ref_vt, ref_scale = fp8.quantize_v(v.cpu(), tile)  # torch's, on the CPU
    assert torch.equal(vscale.cpu(), ref_scale) and torch.equal(vt.view(torch.uint8).cpu(), ref_vt.view(torch.uint8))


def test_a_failing_fused_kernel_falls_back_to_the_torch_functions_with_one_warning(monkeypatch):
    """Where Triton cannot compile or launch (no C compiler, say) the torch functions quantize instead: the same
    values, one RuntimeWarning naming why, and no second attempt."""
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("no C compiler")

    monkeypatch.setattr(fp8, "fused_quantize", broken)
    monkeypatch.setattr(fp8, "_FUSED_FAILED", [])
    monkeypatch.setattr(fp8, "_fake_mode", lambda: False)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))  # the GPU branch, on CPU tensors
    q, k = torch.randn(1, 100, 4, 64).bfloat16(), torch.randn(1, 100, 2, 64).bfloat16()
    config = ForwardConfig(tile_m=64, tile_n=64, num_threads=128, num_stages=2, Q_in_regs=False, kernel="sm120_fp8")
    with pytest.warns(RuntimeWarning, match="fused Triton quantization failed .*no C compiler"):
        got = fp8.quantize_inputs(q, k, config, 0.125)
    again = fp8.quantize_inputs(q, k, config, 0.125)
    monkeypatch.undo()
    want = fp8.quantize_inputs(q, k, config, 0.125)
    assert calls == [1]  # tried once
    for g, a, w in zip(got, again, want):
        assert torch.equal(g.float(), w.float()) and torch.equal(a.float(), w.float())
