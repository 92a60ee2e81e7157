"""FP8 (e4m3) Q/K forward attention for SM120 on top of FA4's SM120 (SM80-path) forward: a CPU-only prototype.

Q, K: Float8E4M3FN (per-tile quantized; q_scale[b, h, m_blocks], k_scale[b, h_kv, n_blocks] fp32 dequant scales),
V, O: bfloat16, LSE: fp32. S = Q K^T on mma.sync m16n8k32 e4m3 (MmaFP8Op), P @ V unchanged (bf16 m16n8k16).

Run from the repository root:  uv run python docs/measurements/data/2026-12-06-fp8/proto.py [--quick] [--ref]
It compiles every config below for sm_120a with fake tensors (no GPU) and prints registers, spills, shared
memory and the SASS MMA census (QMMA = e4m3 MMA, HMMA = bf16 MMA) of each cubin; upstream's bf16 kernel is
compiled beside each for comparison. `--ref` also runs the CPU quantization reference self-test.

Every change against upstream flash_attn/cute/flash_fwd.py (FlashAttentionForwardSm80, 4.0.0b36) is marked `# FP8:`.
"""

import os
import sys
import tempfile

if __name__ == "__main__":  # the DSL fixes its arch at import: name sm_120a before cutlass is imported
    _DUMP = tempfile.mkdtemp(prefix="fp8-proto-")
    os.environ.update(FLASH_ATTENTION_ARCH="sm_120", CUTE_DSL_ARCH="sm_120a", CUTE_DSL_KEEP="cubin",
                      CUTE_DSL_DUMP_DIR=_DUMP, PYTHONWARNINGS="ignore")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), *[os.pardir] * 4))  # fa4tune

import math
import warnings
from functools import partial
from types import SimpleNamespace
from typing import Callable, Optional, Type

warnings.filterwarnings("ignore")

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Float8E4M3FN, Int32, const_expr
from cutlass.base_dsl.arch import Arch
from cutlass.cute.nvgpu import cpasync, warp
from quack import layout_utils

from flash_attn.cute import ampere_helpers as sm80_utils
from flash_attn.cute import utils
from flash_attn.cute.block_info import BlockInfo
from flash_attn.cute.block_sparsity import BlockSparseTensors
from flash_attn.cute.cute_dsl_utils import assume_tensor_aligned
from flash_attn.cute.flash_fwd_sm120 import FlashAttentionForwardSm120
from flash_attn.cute.mask import AttentionMask
from flash_attn.cute.pack_gqa import PackGQA, pack_gqa_layout
from flash_attn.cute.seqlen_info import SeqlenInfoQK
from flash_attn.cute.softmax import Softmax
from flash_attn.cute.tile_scheduler import SingleTileScheduler, SingleTileVarlenScheduler, TileSchedulerArguments
from flash_attn.cute.utils import AuxData

FP8_MAX = 448.0  # largest finite e4m3fn


# The kernel graduated to kernels/fp8_forward_sm120.py (kernel "sm120_fp8", 2026-12-06); this script compiles that
# class (the same code: git log -p -- this file shows the prototype as it ran first).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), *[os.pardir] * 4))  # the repository root
from kernels.fp8_forward_sm120 import Fp8ForwardSm120 as FlashAttentionForwardSm120Fp8  # noqa: E402
from kernels.fp8_forward_sm120 import fp8_smem_layout_atom  # noqa: E402,F401  (check_layouts)


# ----------------------------------------------------------------------------------------------------------------
# CPU quantization reference (for the later GPU check): per-tile e4m3 with scale = amax / 448.
# ----------------------------------------------------------------------------------------------------------------


def quantize_per_tile(x, tile: int):
    """x: (b, s, h, d) float tensor. Returns (x_e4m3 (b, s, h, d) float8_e4m3fn, scale (b, h, ceil(s/tile)) fp32)
    with x ~= x_e4m3 * scale[b, h, row // tile]; scale = amax(|tile|) / 448 (1 for an all-zero tile)."""
    import torch

    b, s, h, d = x.shape
    blocks = -(-s // tile)
    pad = blocks * tile - s
    xp = torch.nn.functional.pad(x.float(), (0, 0, 0, 0, 0, pad))  # pad seqlen with zeros
    xt = xp.view(b, blocks, tile, h, d)
    amax = xt.abs().amax(dim=(2, 4))  # (b, blocks, h)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (xt / scale[:, :, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.view(b, blocks * tile, h, d)[:, :s].contiguous(), scale.permute(0, 2, 1).contiguous()


def dequantize_per_tile(xq, scale, tile: int):
    b, s, h, d = xq.shape
    rows = scale.permute(0, 2, 1).repeat_interleave(tile, dim=1)[:, :s]  # (b, s, h)
    return xq.float() * rows[..., None]


def reference_attention(q, k, v, softmax_scale, causal, qh_per_kvh=1):
    """fp32 attention on (b, s, h, d) tensors (k / v with h_kv heads); returns (out (b, s, h, dv), lse (b, h, s))."""
    import torch

    k = k.repeat_interleave(qh_per_kvh, dim=2)
    v = v.repeat_interleave(qh_per_kvh, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) * softmax_scale
    if causal:  # bottom-right aligned, as FA
        sq, sk = q.shape[1], k.shape[1]
        mask = torch.ones(sq, sk, dtype=torch.bool, device=s.device).tril(diagonal=sk - sq)
        s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    out = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, dim=-1), v.float())
    return out, lse


def reference_selftest():
    """Quantize random Q / K per tile, check the dequantized attention against the unquantized one (CPU)."""
    import torch

    torch.manual_seed(0)
    b, s, h, d, tm, tn = 1, 512, 2, 128, 128, 64
    q, k, v = (torch.randn(b, s, h, d) for _ in range(3))
    qq, qs = quantize_per_tile(q, tm)
    kq, ks = quantize_per_tile(k, tn)
    scale = 1 / math.sqrt(d)
    for causal in (False, True):
        out_ref, lse_ref = reference_attention(q, k, v, scale, causal)
        out_q, lse_q = reference_attention(dequantize_per_tile(qq, qs, tm), dequantize_per_tile(kq, ks, tn), v, scale, causal)
        print(f"  reference selftest causal={causal}: max|dO| fp8-vs-fp32 {(out_q - out_ref).abs().max():.4f}, "
              f"max|dLSE| {(lse_q - lse_ref).abs().max():.4f}, q_scale {tuple(qs.shape)}, k_scale {tuple(ks.shape)}")


# ----------------------------------------------------------------------------------------------------------------
# Fake-tensor compile for sm_120a and the cubin's facts.
# ----------------------------------------------------------------------------------------------------------------


def sass_census(cubin: bytes) -> dict:
    """SASS of the cubin (the triton wheel's cuobjdump): MMA kinds, ldmatrix, local-memory traffic."""
    import re
    import subprocess
    from pathlib import Path

    from fa4tune.cubin import local_traffic_bytes, tool_path

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        sass = subprocess.run([str(tool_path("cuobjdump")), "-sass", str(path)], capture_output=True, text=True,
                              check=True).stdout
    mma = {}
    for op in re.findall(r"\b([HQO]MMA(?:\.[A-Z0-9]+)*)\b", sass):
        mma[op] = mma.get(op, 0) + 1
    stores, loads = local_traffic_bytes(sass)
    return dict(mma=mma, ldsm=len(re.findall(r"\bLDSM\b", sass)), ldsm_t=len(re.findall(r"\bLDSM\.16\.MT88", sass)),
                stl=stores, ldl=loads, sass=sass)


def compile_one(fp8: bool, d: int, tile_m: int, tile_n: int, stages: int, causal: bool, threads: int = 128,
                b: int = 1, s: int = 4096, h: int = 16, h_kv: int = 16, scales: bool = True):
    import time

    from quack.compile_utils import make_fake_tensor

    from fa4tune.cubin import read_cubin

    bf = cutlass.BFloat16
    qk = Float8E4M3FN if fp8 else bf
    div_qk, div_v = 128 // qk.width, 128 // bf.width  # 16-byte aligned strides
    mQ = make_fake_tensor(qk, (b, s, h, d), divisibility=div_qk)
    mK = make_fake_tensor(qk, (b, s, h_kv, d), divisibility=div_qk)
    mV = make_fake_tensor(bf, (b, s, h_kv, d), divisibility=div_v)
    mO = make_fake_tensor(bf, (b, s, h, d), divisibility=div_v)
    mLSE = make_fake_tensor(Float32, (b, h, s), divisibility=1)
    cls = FlashAttentionForwardSm120Fp8 if fp8 else FlashAttentionForwardSm120
    fa = cls(bf, d, d, h // h_kv, is_causal=causal, pack_gqa=False, tile_m=tile_m, tile_n=tile_n,
             num_stages=stages, num_threads=threads)
    kwargs = {}
    if fp8 and scales:
        kwargs = dict(mQScale=make_fake_tensor(Float32, (b, h, -(-s // tile_m)), divisibility=1),
                      mKScale=make_fake_tensor(Float32, (b, h_kv, -(-s // tile_n)), divisibility=1))
    t0 = time.perf_counter()
    fn = cute.compile(fa, mQ, mK, mV, mO, mLSE, Float32(1.0 / math.sqrt(d)), **kwargs,
                      stream=cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")
    seconds = time.perf_counter() - t0
    facts = read_cubin(fn.__cubin__)
    census = sass_census(fn.__cubin__)
    smem = getattr(fa, "smem_bytes_traced", None)
    if smem is None:  # upstream: the same struct it launches with
        smem = int(fa._get_shared_storage_cls_size) if hasattr(fa, "_get_shared_storage_cls_size") else None
    return dict(regs=facts.registers, stack=facts.stack_bytes, spill_st=census["stl"], spill_ld=census["ldl"],
                smem=smem, static_smem=facts.static_smem_bytes, mma=census["mma"], ldsm=census["ldsm"],
                ldsm_t=census["ldsm_t"], seconds=seconds, sass=census["sass"])


def _record_upstream_smem():
    """Upstream's SharedStorage size, recorded when its kernel is traced (as fa4tune.fake_compile does)."""
    from flash_attn.cute.flash_fwd import FlashAttentionForwardSm80

    own = FlashAttentionForwardSm80._get_shared_storage_cls

    def wrapped(self):
        storage = own(self)
        self._get_shared_storage_cls_size = int(storage.size_in_bytes())
        return storage

    FlashAttentionForwardSm80._get_shared_storage_cls = wrapped


@cute.jit
def _print_mma_layouts(warps: cutlass.Constexpr[int]):
    bf = cute.make_tiled_mma(warp.MmaF16BF16Op(cutlass.BFloat16, Float32, (16, 8, 16)), (warps, 1, 1),
                             permutation_mnk=(warps * 16, 16, 16))
    f8 = cute.make_tiled_mma(warp.MmaFP8Op(Float8E4M3FN, Float32, (16, 8, 32)), (warps, 1, 1),
                             permutation_mnk=(warps * 16, 16, 32))
    print("  C (S acc) TV layout, bf16 m16n8k16:", bf.tv_layout_C_tiled)
    print("  C (S acc) TV layout, e4m3 m16n8k32:", f8.tv_layout_C_tiled)
    print("  S acc per thread for 128x64: bf16", bf.get_slice(0).partition_shape_C((128, 64)),
          " e4m3", f8.get_slice(0).partition_shape_C((128, 64)))
    print("  A TV layout, e4m3 m16n8k32:", f8.tv_layout_A_tiled)
    atom = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), Float8E4M3FN)
    print("  ldmatrix.x4 atom on e4m3, dst TV:", atom.layout_dst_tv if hasattr(atom, "layout_dst_tv") else atom)
    print("  ldmatrix tiled copy A (e4m3) TV:", cute.make_tiled_copy_A(atom, f8).layout_tv_tiled
          if hasattr(cute.make_tiled_copy_A(atom, f8), "layout_tv_tiled") else "")


def _bank_conflict_ways(row_bytes: int, bits: int, base: int, shift: int) -> int:
    """Worst bank-conflict degree of ldmatrix phases (8 consecutive rows, one 16-byte chunk column) on a 1-byte
    K-major tile of `row_bytes`-byte rows under Swizzle<bits, base, shift> (plain Python model)."""
    def swz(x):
        return x ^ ((x & (((1 << bits) - 1) << (base + shift))) >> shift) if bits else x
    worst = 1
    for r0 in range(0, 64, 8):
        for c in range(row_bytes // 16):
            count = {}
            for r in range(r0, r0 + 8):
                a = swz(r * row_bytes + c * 16)
                for w in range(4):
                    count[(a // 4 + w) % 32] = count.get((a // 4 + w) % 32, 0) + 1
            worst = max(worst, max(count.values()))
    return worst


def check_layouts():
    print("layout checks (trace time):")
    _print_mma_layouts(4)
    for row_bytes, ours, upstream in ((128, (3, 4, 3), (4, 4, 4)), (64, (2, 4, 3), (3, 4, 4))):
        print(f"  e4m3 smem rows of {row_bytes} B: ldmatrix bank-conflict ways, this atom Swizzle{ours}: "
              f"{_bank_conflict_ways(row_bytes, *ours)}; upstream get_smem_layout_atom(Float8) Swizzle{upstream}: "
              f"{_bank_conflict_ways(row_bytes, *upstream)}")


def mma_counts(r: dict) -> tuple[int, int]:
    qmma = sum(n for op, n in r["mma"].items() if op.startswith("QMMA") and "E4M3" in op)
    hmma = sum(n for op, n in r["mma"].items() if op.startswith("HMMA"))
    return qmma, hmma


def main(argv=None):
    import argparse
    import traceback

    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="one config only")
    p.add_argument("--no-baseline", action="store_true", help="skip upstream bf16 compiles")
    p.add_argument("--ref", action="store_true", help="run the CPU quantization reference self-test")
    p.add_argument("--sass", default="", help="write the first fp8 config's SASS to this path")
    args = p.parse_args(argv)
    _record_upstream_smem()
    check_layouts()
    if args.ref:
        reference_selftest()
    configs = [(d, tn, st, c, True) for d in (128, 64) for tn in (64, 128) for st in (1, 2) for c in (False, True)]
    configs = configs[:1] if args.quick else configs + [(128, 64, 1, False, False), (128, 64, 1, True, False)]
    print("sm_120a, fake tensors b=1 s=4096 h=16, tile_m=128, 128 threads. spill = STL+LDL bytes in the SASS; smem = the "
          "launch's dynamic shared memory (SharedStorage); QMMA = e4m3 m16n8k32, HMMA = bf16 m16n8k16, LDSM = ldmatrix "
          "x4 (non-trans: Q/K, .MT88 trans: V) SASS instruction counts. bf16 = upstream FlashAttentionForwardSm120 "
          "(same tiles). SM120 allows 101376 B (99 KB) of dynamic smem per CTA.")
    hdr = (f"{'d':>3} {'tn':>3} {'st':>2} {'causal':>6} {'scales':>6} | {'fp8':>4} {'regs':>4} {'spill':>9} {'smem':>6} "
           f"{'QMMA':>4} {'HMMA':>4} {'LDSM':>4} {'LDSMT':>5} | {'bf16':>4} {'regs':>4} {'spill':>9} {'smem':>6} {'HMMA':>4}")
    print(hdr)
    print("-" * len(hdr))
    for i, (d, tn, st, causal, scales) in enumerate(configs):
        line = f"{d:>3} {tn:>3} {st:>2} {str(causal):>6} {str(scales):>6} | "
        try:
            r = compile_one(True, d, 128, tn, st, causal, scales=scales)
            if args.sass and i == 0:
                open(args.sass, "w").write(r["sass"])
            qmma, hmma = mma_counts(r)
            fits = "ok" if r["smem"] <= 101376 else "big"
            line += (f"{fits:>4} {r['regs']:>4} {str(r['spill_st']) + '+' + str(r['spill_ld']):>9} {r['smem']:>6} "
                     f"{qmma:>4} {hmma:>4} {r['ldsm'] - r['ldsm_t']:>4} {r['ldsm_t']:>5} | ")
        except Exception as err:
            traceback.print_exc()
            line += f"FAIL {type(err).__name__}: {str(err)[:80]} | "
        if not args.no_baseline and scales:
            try:
                r = compile_one(False, d, 128, tn, st, causal)
                fits = "ok" if r["smem"] <= 101376 else "big"
                line += (f"{fits:>4} {r['regs']:>4} {str(r['spill_st']) + '+' + str(r['spill_ld']):>9} {r['smem']:>6} "
                         f"{mma_counts(r)[1]:>4}")
            except Exception as err:
                line += f"FAIL {type(err).__name__}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
