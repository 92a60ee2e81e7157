"""The FP8 accuracy table (issue 45): per prefill problem of a suite and input kind (standard normal, FlashAttention-3's
scattered outliers, large-magnitude channels: fa4tune.harness.fp8_gate), the error of Q and K quantized per tile to
e4m3 against fp32 attention on the unquantized inputs, beside the error of plain attention in bf16 on the same
inputs, and the FP8 gate's verdict.

    uv run python bench/fp8_accuracy.py [--suites standard] [--inputs normal,outliers,channels] [--no-smooth-k]
                                        [--heads 2] [--max-seqlen 8192] [--only SUBSTRING]

The FP8 side is the reference quantizer (fa4tune/fp8.py: K smoothed unless --no-smooth-k, tiles of --tile-m query and
--tile-n key rows, the kernel's) followed by fp32 attention and the LSE's smoothing correction: the quantization's
error, which the SM120 FP8 prototype adds a tenth to on a GPU (docs/measurements/2026-12-06-h100-models-twins-
varlen.md section 4). It runs on the CPU: each problem's first --heads query heads of batch 0 (with their K/V heads),
problems longer than --max-seqlen left out.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fa4tune import fp8  # noqa: E402
from fa4tune.config import DECODE_MAX_SEQLEN_Q  # noqa: E402
from fa4tune.harness import fp8_gate, gate  # noqa: E402
from fa4tune.suites import load_suite  # noqa: E402


INPUTS = ("normal", "outliers", "channels")


def inputs(problem, heads: int, kind: str, seed: int) -> list[torch.Tensor]:
    """q, k, v in bf16 for batch 0 and the first `heads` query heads of a problem (their K/V heads with them)."""
    group = problem.num_heads // problem.num_heads_kv
    kv_heads = max(1, heads // group)
    shapes = [(1, problem.seqlen_q, kv_heads * group, problem.head_dim), (1, problem.seqlen_k, kv_heads, problem.head_dim),
              (1, problem.seqlen_k, kv_heads, problem.head_dim_v)]
    generator = torch.Generator().manual_seed(seed)
    if kind == "outliers":
        return fp8_gate.outlier_inputs(shapes, torch.bfloat16, generator)
    if kind == "channels":
        return fp8_gate.channel_outlier_inputs(*shapes, torch.bfloat16, generator)
    return [torch.randn(s, generator=generator).to(torch.bfloat16) for s in shapes]


def measure(problem, heads: int, kind: str, tile_m: int, tile_n: int, smooth: bool = True, seed: int = 0) -> dict:
    q, k, v = inputs(problem, heads, kind, seed)
    ref = gate.reference_attention(q, k, v, problem.causal)
    k_in, mean = fp8.smooth_k(k) if smooth else (k, None)
    qd = fp8.dequantize_per_tile(*fp8.quantize_per_tile(q, tile_m), tile_m)
    kd = fp8.dequantize_per_tile(*fp8.quantize_per_tile(k_in, tile_n), tile_n)
    quantized = gate.reference_attention(qd, kd, v, problem.causal)
    lse = quantized.lse + fp8.lse_correction(q, mean, 1 / math.sqrt(problem.head_dim)) if smooth else quantized.lse
    bf16 = gate.reference_attention(q, k, v, problem.causal, dtype=torch.bfloat16)
    verdict = fp8_gate.check(quantized.out, lse, ref.out, ref.lse)
    bf_l2, bf_cos = fp8_gate.head_errors(bf16.out.float(), ref.out)
    return {
        "problem": problem.name, "inputs": kind, "heads": q.shape[2],
        "fp8_rel_l2": verdict.rel_l2, "fp8_cos": verdict.cos, "fp8_lse_rel_l2": verdict.lse_rel_l2,
        "fp8_rmse": (quantized.out - ref.out).pow(2).mean().sqrt().item(),
        "bf16_rel_l2": bf_l2.max().item(), "bf16_cos": bf_cos.min().item(), "passed": verdict.passed, "reason": verdict.reason,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suites", default="standard")
    parser.add_argument("--heads", type=int, default=2, help="query heads of batch 0 per problem")
    parser.add_argument("--max-seqlen", type=int, default=8192)
    parser.add_argument("--only", default="", help="only problems whose name contains this")
    parser.add_argument("--tile-m", type=int, default=128, help="query rows per Q scale")
    parser.add_argument("--tile-n", type=int, default=64, help="key rows per K scale")
    parser.add_argument("--inputs", default=",".join(INPUTS), help=f"comma-separated input kinds ({', '.join(INPUTS)})")
    parser.add_argument("--no-smooth-k", action="store_true", help="quantize K as it is (no mean subtraction)")
    args = parser.parse_args(argv)
    kinds = [k for k in args.inputs.split(",") if k]
    if not kinds or any(k not in INPUTS for k in kinds):
        parser.error(f"--inputs: each of {', '.join(INPUTS)}, got {args.inputs!r}")
    if args.heads < 1 or args.tile_m < 1 or args.tile_n < 1:
        parser.error(f"--heads, --tile-m and --tile-n must be >= 1, got {args.heads}, {args.tile_m}, {args.tile_n}")
    problems = [p for s in args.suites.split(",") for p in load_suite(s)
                if p.seqlen_q > DECODE_MAX_SEQLEN_Q and max(p.seqlen_q, p.seqlen_k) <= args.max_seqlen and args.only in p.name]
    if not problems:
        parser.error(f"no prefill problem of {args.suites} with --only {args.only!r} and --max-seqlen {args.max_seqlen}")
    print(f"FP8 gate: per head, relative L2 <= {fp8_gate.REL_L2_MAX}, cosine >= {fp8_gate.COS_MIN}, "
          f"LSE relative L2 <= {fp8_gate.LSE_REL_L2_MAX}; e4m3 Q per {args.tile_m} rows, K per {args.tile_n} rows, "
          f"K {'as it is' if args.no_smooth_k else 'smoothed'}")
    print("| problem | inputs | heads | fp8 rel L2 | fp8 cos | fp8 LSE rel L2 | fp8 RMSE | bf16 rel L2 | bf16 cos | gate |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    failed = 0
    for p in problems:
        for kind in kinds:
            r = measure(p, args.heads, kind, args.tile_m, args.tile_n, smooth=not args.no_smooth_k)
            failed += not r["passed"]
            print(f"| {r['problem']} | {r['inputs']} | {r['heads']} | {r['fp8_rel_l2']:.4f} | {r['fp8_cos']:.5f} | "
                  f"{r['fp8_lse_rel_l2']:.4f} | {r['fp8_rmse']:.2e} | {r['bf16_rel_l2']:.4f} | {r['bf16_cos']:.6f} | "
                  f"{'pass' if r['passed'] else r['reason']} |", flush=True)
    print(f"{len(kinds) * len(problems) - failed} of {len(kinds) * len(problems)} pass the FP8 gate")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
