"""The FP8 prototype on the standard suite's prefill shapes (issue 45's done criterion, UNRUN: written on the CPU):
per shape and input kind (fa4tune.harness.fp8_gate: normal, scattered outliers, large channels), K smoothed and Q, K
quantized per tile on the host (fa4tune/fp8.py), proto.py's kernel, the LSE corrected, then the FP8 gate against fp32
attention on the unquantized inputs; then its time against the bf16 table's forward (experiment.attention) on the
same shape, interleaved rounds of CUDA events, with the host's smoothing and quantization counted and not.

    python3 docs/measurements/data/2026-12-06-fp8/gpu_standard.py [--only SUBSTRING] [--rounds 20]
    uv run python docs/measurements/data/2026-12-06-fp8/gpu_standard.py --dry-run   # CPU: every step but the kernel

On an H100 or H200 e4m3 mma.sync is lowered to fp16 HMMA (2026-12-05-fp8-mma-sass.md; bench/mma_rate.py measures
it): the time there says what the FP8 path costs around the mma, not what SM120's FP8 rate gives. Tiles: 128 x 64
(d128) and 128 x 128 (d64, d96 as d128's), one stage, 128 threads (proto.py's compile table: no spill at d64). With
--dry-run the kernel is replaced by fp32 attention on the dequantized inputs (what the kernel computes), so the gate,
the LSE correction and the table are exercised without a GPU.
"""

import argparse
import math
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
DRY = "--dry-run" in sys.argv
if not DRY:
    import torch

    major, minor = torch.cuda.get_device_capability()
    os.environ.setdefault("CUTE_DSL_ARCH", f"sm_{major}{minor}a")
os.environ.setdefault("FLASH_ATTENTION_ARCH", "sm_120")
sys.path[:0] = [str(HERE), str(ROOT)]

import torch  # noqa: E402

from fa4tune import fp8  # noqa: E402
from fa4tune.harness import fp8_gate, gate  # noqa: E402
from fa4tune.suites import load_suite  # noqa: E402

KINDS = ("normal", "outliers", "channels")


def inputs(problem, kind: str, device, seed: int = 0):
    shapes = [(problem.batch, problem.seqlen_q, problem.num_heads, problem.head_dim),
              (problem.batch, problem.seqlen_k, problem.num_heads_kv, problem.head_dim),
              (problem.batch, problem.seqlen_k, problem.num_heads_kv, problem.head_dim_v)]
    generator = torch.Generator(device=device).manual_seed(seed)
    if kind == "outliers":
        return fp8_gate.outlier_inputs(shapes, torch.bfloat16, generator, device)
    if kind == "channels":
        return fp8_gate.channel_outlier_inputs(*shapes, torch.bfloat16, generator, device)
    return [torch.randn(s, generator=generator, device=device).to(torch.bfloat16) for s in shapes]


class Fp8Forward:
    """proto.py's kernel for one problem: compiled once, then called on host-quantized inputs."""

    def __init__(self, problem, tile_m: int = 128, stages: int = 1):
        self.tile_m, self.tile_n = tile_m, 64 if problem.head_dim > 64 else 128
        self.causal, self.scale = problem.causal, 1.0 / math.sqrt(problem.head_dim)
        self.problem, self.stages, self.compiled = problem, stages, None

    def quantize(self, q, k):
        k_smoothed, mean = fp8.smooth_k(k)
        (qq, qs), (kq, ks) = fp8.quantize_per_tile(q, self.tile_m), fp8.quantize_per_tile(k_smoothed, self.tile_n)
        return qq, qs, kq, ks, mean

    def kernel(self, qq, qs, kq, ks, v):
        if DRY:  # what the kernel computes: fp32 attention on the dequantized tiles
            ref = gate.reference_attention(fp8.dequantize_per_tile(qq, qs, self.tile_m),
                                           fp8.dequantize_per_tile(kq, ks, self.tile_n), v, self.causal)
            return ref.out.to(torch.bfloat16), ref.lse
        import cutlass
        import cutlass.cute as cute
        from cutlass import Float32
        from flash_attn.cute.cute_dsl_utils import to_cute_tensor
        from flash_attn.cute.utils import AuxData

        import proto

        b, s, h, d = qq.shape
        out = torch.empty(b, s, h, v.shape[-1], device=v.device, dtype=torch.bfloat16)
        lse = torch.empty(b, h, s, device=v.device, dtype=torch.float32)
        if self.compiled is None:
            fa = proto.FlashAttentionForwardSm120Fp8(cutlass.BFloat16, d, v.shape[-1], h // kq.shape[2], is_causal=self.causal,
                                                     pack_gqa=False, tile_m=self.tile_m, tile_n=self.tile_n,
                                                     num_stages=self.stages, num_threads=128)
            tensors = [to_cute_tensor(t) for t in (qq, kq, v, out)]
            scales = [to_cute_tensor(t, assumed_align=4) for t in (qs, ks)]
            self.compiled = cute.compile(fa, *tensors, to_cute_tensor(lse, assumed_align=4), Float32(self.scale), None, None,
                                         None, None, None, None, None, None, None, AuxData(None, None), None, None, *scales,
                                         cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")
        self.compiled(qq.view(torch.uint8), kq.view(torch.uint8), v, out, lse, self.scale, None, None, None, None, None, None,
                      None, None, None, AuxData(None, None), None, None, qs, ks)
        return out, lse

    def __call__(self, q, k, v):
        qq, qs, kq, ks, mean = self.quantize(q, k)
        out, lse = self.kernel(qq, qs, kq, ks, v)
        return out, lse + fp8.lse_correction(q, mean, self.scale)


def timed(calls: dict, rounds: int) -> dict:
    """Median ms per call of each candidate, the candidates interleaved in every round (CUDA events)."""
    times = {name: [] for name in calls}
    for name, fn in calls.items():  # warm up (and compile)
        fn()
    torch.cuda.synchronize()
    for r in range(rounds):
        for name in (list(calls) if r % 2 == 0 else list(reversed(calls))):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            calls[name]()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end))
    return {name: statistics.median(t) for name, t in times.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--dry-run", action="store_true", help="CPU: the reference in place of the kernel, small shapes")
    args = parser.parse_args(argv)
    device = "cpu" if args.dry_run else "cuda"
    problems = [p for p in load_suite("standard") if p.seqlen_q > 16 and args.only in p.name]
    if args.dry_run:  # the CPU runs every step on a shape of each class, 256 tokens, 2 heads
        from dataclasses import replace
        problems = [replace(p, batch=1, seqlen_q=256, seqlen_k=256, num_heads=2 * (p.num_heads // p.num_heads_kv),
                            num_heads_kv=2) for p in problems[:1] + [p for p in problems if p.num_heads != p.num_heads_kv][:1]]
    print("| problem | inputs | fp8 rel L2 | fp8 cos | fp8 LSE rel L2 | gate |")
    print("|---|---|---|---|---|---|")
    failed = 0
    forwards = {}
    for p in problems:
        forwards[p.name] = forward = Fp8Forward(p)
        for kind in KINDS:
            q, k, v = inputs(p, kind, device)
            ref = gate.reference_attention(q, k, v, p.causal)
            out, lse = forward(q, k, v)
            check = fp8_gate.check(out.float(), lse, ref.out, ref.lse)
            failed += not check.passed
            print(f"| {p.name}{' (dry run: 256 tokens, 2 K/V heads)' if args.dry_run else ''} | {kind} | {check.rel_l2:.4f} | {check.cos:.5f} | {check.lse_rel_l2:.4f} | "
                  f"{'pass' if check.passed else check.reason} |", flush=True)
    print(f"{len(problems) * len(KINDS) - failed} of {len(problems) * len(KINDS)} pass the FP8 gate", flush=True)
    if args.dry_run:
        return 1 if failed else 0
    import experiment

    print("\n| problem | bf16 table ms | fp8 kernel ms | fp8 with smoothing and quantization ms | kernel / table | whole / table |")
    print("|---|---|---|---|---|---|")
    for p in problems:
        q, k, v = inputs(p, "normal", device)
        forward = forwards[p.name]
        quantized = forward.quantize(q, k)
        ms = timed({"table": lambda: experiment.attention(q, k, v, causal=p.causal),
                    "kernel": lambda: forward.kernel(*quantized[:4], v),
                    "whole": lambda: forward(q, k, v)}, args.rounds)
        print(f"| {p.name} | {ms['table']:.4f} | {ms['kernel']:.4f} | {ms['whole']:.4f} | {ms['table'] / ms['kernel']:.3f}x | "
              f"{ms['table'] / ms['whole']:.3f}x |", flush=True)
    print(f"{torch.cuda.get_device_name()}; SM120 kernels emulated where not SM 12.0 (FLASH_ATTENTION_ARCH=sm_120)")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
