"""GPU correctness check of proto.py's FP8 forward (UNRUN here: written on a CPU-only machine).

Runs on any GPU with mma.sync e4m3 (sm_89+: RTX 5090 = sm_120a, also H100/H200 = sm_90a, which run the same SM80-path
code): quantizes random Q/K per tile (e4m3, scale = amax/448), runs the kernel, and compares O and LSE with an fp32
reference on the dequantized Q/K (so only the kernel's own error is measured), and with the unquantized bf16
reference (the quantization error, for information).

    uv run python docs/measurements/data/2026-12-06-fp8/gpu_check.py   # from the repository root
"""

import math
import os
import sys

import torch

COMPILE_ONLY = "--compile-only" in sys.argv  # CPU dry run: fake tensors, sm_120a, no launch
major, minor = (12, 0) if COMPILE_ONLY else torch.cuda.get_device_capability()
os.environ.setdefault("CUTE_DSL_ARCH", f"sm_{major}{minor}a")
os.environ.setdefault("FLASH_ATTENTION_ARCH", "sm_120")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass import Float32  # noqa: E402

from flash_attn.cute.cute_dsl_utils import to_cute_tensor  # noqa: E402
from flash_attn.cute.utils import AuxData  # noqa: E402

import proto  # noqa: E402


def run_one(b, s, h, d, tile_m, tile_n, stages, causal, seed=0):
    torch.manual_seed(seed)
    dev = "cuda"
    q, k, v = (torch.randn(b, s, h, d, device=dev, dtype=torch.bfloat16) for _ in range(3))
    qq, qs = proto.quantize_per_tile(q, tile_m)
    kq, ks = proto.quantize_per_tile(k, tile_n)
    out = torch.empty(b, s, h, d, device=dev, dtype=torch.bfloat16)
    lse = torch.empty(b, h, s, device=dev, dtype=torch.float32)
    scale = 1.0 / math.sqrt(d)
    fa = proto.FlashAttentionForwardSm120Fp8(cutlass.BFloat16, d, d, 1, is_causal=causal, pack_gqa=False,
                                             tile_m=tile_m, tile_n=tile_n, num_stages=stages, num_threads=128)
    ct = [to_cute_tensor(t) for t in (qq, kq, v, out)]
    c_lse = to_cute_tensor(lse, assumed_align=4)
    c_qs, c_ks = (to_cute_tensor(t, assumed_align=4) for t in (qs, ks))
    # positional, as flash_attn.cute.interface calls it: ..., softmax_scale, cu_q, cu_k, used_q, used_k, page_table,
    # window_left, window_right, sink, blocksparse, aux_data, cu_total_m, cu_total_splits, q_scale, k_scale, stream
    fn = cute.compile(fa, *ct, c_lse, Float32(scale), None, None, None, None, None, None, None, None, None,
                      AuxData(None, None), None, None, c_qs, c_ks,
                      cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")
    if COMPILE_ONLY:
        print(f"d={d} tile={tile_m}x{tile_n} stages={stages} causal={causal}: compiled (not run)", flush=True)
        return True
    fn(qq.view(torch.uint8), kq.view(torch.uint8), v, out, lse, scale, None, None, None, None, None, None, None, None,
       None, AuxData(None, None), None, None, qs, ks)
    torch.cuda.synchronize()
    qd = proto.dequantize_per_tile(qq, qs, tile_m)
    kd = proto.dequantize_per_tile(kq, ks, tile_n)
    o_ref, lse_ref = proto.reference_attention(qd, kd, v.float(), scale, causal)
    o_bf, _ = proto.reference_attention(q.float(), k.float(), v.float(), scale, causal)
    err_o = (out.float() - o_ref).abs().max().item()
    err_lse = (lse - lse_ref).abs().max().item()
    err_q = (o_ref - o_bf).abs().max().item()
    ok = err_o < 2e-2 and err_lse < 1e-2 and not torch.isnan(out).any()
    print(f"d={d} tile={tile_m}x{tile_n} stages={stages} causal={causal} s={s}: max|O-ref| {err_o:.4f} "
          f"max|LSE-ref| {err_lse:.5f} (quantization alone: max|O| {err_q:.4f}) {'OK' if ok else 'FAIL'}", flush=True)
    return ok


if __name__ == "__main__":
    if COMPILE_ONLY:
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode():
            run_one(2, 1000, 4, 128, 128, 64, 2, True)
        sys.exit(0)
    results = []
    # (d, tile_n, stages, causal, seqlen): both head dims, both tile widths, 1 and 2 stages, causal and not; seqlen
    # 1000 leaves partial last m and n tiles (128x128 with 2 stages at d128 needs 112 KB: over 99 KB, left out)
    cases = [(128, 64, 1, False, 1024), (128, 64, 1, True, 1000), (128, 64, 2, False, 1000), (128, 64, 2, True, 1024),
             (128, 128, 1, True, 1000), (64, 64, 2, True, 1000), (64, 128, 1, False, 1000), (64, 128, 2, True, 1024)]
    for d, tn, st, causal, s in cases:
        try:
            results.append(run_one(2, s, 4, d, 128, tn, st, causal))
        except Exception as err:  # noqa: BLE001
            print(f"d={d} tn={tn} st={st} causal={causal} s={s}: ERROR {type(err).__name__}: {err}"[:400], flush=True)
            results.append(False)
    print(f"{sum(results)}/{len(results)} OK")
