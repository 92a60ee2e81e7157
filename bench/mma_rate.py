"""mma.sync throughput per input type (bf16 and fp16 m16n8k16, e4m3 m16n8k32, fp32 accumulate), and whether this
GPU runs each as one tensor-core instruction or lowers it (issue #45 item 1).

    python3 bench/mma_rate.py            # on a GPU: TFLOPS of each op, and its ratio to bf16
    python3 bench/mma_rate.py --sass     # no GPU needed: what sm_90a (H100/H200) and sm_120a compile each op to

A kernel of 8 independent accumulator chains per warp, compiled with NVRTC; the A and B registers differ per chain
and change every iteration. Where the op is lowered, an operand shared by the chains or fixed across iterations lets
the compiler compute the product once and add it with FADDs: the shared probe's sm_90a e4m3 loop (the same operands
in every chain and iteration) compiled to 4 HMMAs for 8 chains and timed at 2.4x bf16, an artifact. The SASS says
whether the op is native: sm_120a runs e4m3 as QMMA.16832; sm_90a has no FP8 mma.sync and converts to fp16 for
HMMA.16816, so an H100 or H200 emulating SM120 cannot show an FP8 mma.sync speed-up.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

_KERNEL = r'''
extern "C" __global__ void mma_loop(float* out, int iters) {
    unsigned a0 = threadIdx.x, a1 = a0 * 3u, a2 = a0 ^ 5u, a3 = a0 + 7u, b0 = a0 * 11u, b1 = a0 ^ 13u;
    float c[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) for (int i = 0; i < 4; ++i) c[j][i] = 0.f;
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            asm volatile("%OP% {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                : "+f"(c[j][0]), "+f"(c[j][1]), "+f"(c[j][2]), "+f"(c[j][3])
                : "r"(a0 ^ j), "r"(a1 + j), "r"(a2), "r"(a3), "r"(b0 ^ (j << 8)), "r"(b1));
        }
        a0 += 0x01010101u; b0 ^= (unsigned)it;  // operands that differ per chain and per iteration: nothing to share or hoist
    }
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) for (int i = 0; i < 4; ++i) s += c[j][i];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
'''
# name -> (PTX instruction, FLOPs per instruction, the SASS opcode of a native op on sm_90a / sm_120a, or None)
OPS = {
    "bf16 m16n8k16": ("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", 2 * 16 * 8 * 16,
                      {"90a": "HMMA.16816.F32.BF16", "120a": "HMMA.16816.F32.BF16"}),
    "fp16 m16n8k16": ("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", 2 * 16 * 8 * 16,
                      {"90a": "HMMA.16816.F32", "120a": "HMMA.16816.F32"}),
    "e4m3 m16n8k32": ("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32", 2 * 16 * 8 * 32,
                      {"90a": None, "120a": "QMMA.16832.F32.E4M3.E4M3"}),
}
CONVERSIONS = ("F2F", "F2FP", "I2F", "HADD2.F32")


def source(op: str) -> str:
    return _KERNEL.replace("%OP%", OPS[op][0])


def compile_op(op: str, arch: str) -> bytes:
    """The op's kernel as a cubin for `arch` ('90a', '120a'), by NVRTC (no GPU needed)."""
    from torch.cuda._utils import _nvrtc_compile

    return _nvrtc_compile(source(op), "mma_loop", arch, nvcc_options=["-std=c++17"])[0]


def sass_summary(cubin: bytes) -> dict:
    """Opcode counts of a cubin's SASS: tensor-core instructions (by full opcode) and conversions."""
    from fa4tune.cubin import tool_path

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([str(tool_path("cuobjdump")), "-sass", f.name], capture_output=True, text=True, check=True).stdout
    opcodes = [re.split(r"\s+", line.split("*/", 1)[1].strip())[0] for line in text.splitlines()
               if "*/" in line and ";" in line and line.split("*/", 1)[1].strip()]
    mma = {}
    for opcode in opcodes:
        if "MMA" in opcode:
            mma[opcode] = mma.get(opcode, 0) + 1
    return {"mma": mma, "conversions": sum(o.startswith(CONVERSIONS) for o in opcodes)}


def native(op: str, arch: str, summary: dict) -> bool:
    """Whether the op compiled to its own tensor-core instruction on `arch` (no conversions in front of it)."""
    expected = OPS[op][2].get(arch)
    return expected is not None and set(summary["mma"]) == {expected} and summary["conversions"] == 0


def sass_table() -> list[str]:
    rows = ["| op | arch | tensor-core SASS (count) | conversions | native |", "|---|---|---|---|---|"]
    for op in OPS:
        for arch in ("90a", "120a"):
            s = sass_summary(compile_op(op, arch))
            mma = ", ".join(f"{k} ({v})" for k, v in sorted(s["mma"].items())) or "none"
            rows.append(f"| {op} | sm_{arch} | {mma} | {s['conversions']} | {'yes' if native(op, arch, s) else 'no: lowered'} |")
    return rows


def rates(iters: int = 4096) -> list[str]:
    """Best TFLOPS of each op on this GPU over warps per block and blocks per SM."""
    import torch
    from torch.cuda._utils import _cuda_load_module

    major, minor = torch.cuda.get_device_capability()
    arch = f"{major}{minor}{'a' if major >= 9 else ''}"
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = torch.empty(sms * 4 * 512, device="cuda")
    results, skipped = {}, {}
    for op, (_, flops, _) in OPS.items():
        cubin = compile_op(op, arch)
        fn = _cuda_load_module(cubin, ["mma_loop"])["mma_loop"]
        best = 0.0
        for warps in (4, 8, 16):
            for blocks_per_sm in (1, 2, 4):
                def call():
                    fn(grid=(sms * blocks_per_sm, 1, 1), block=(warps * 32, 1, 1), args=[out, iters])
                try:
                    call()
                except RuntimeError as e:  # a lowered op's registers can exceed the SM's file at 16 warps
                    if "too many resources" not in str(e):
                        raise
                    skipped.setdefault(op, []).append(f"{warps} warps")
                    continue
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(5):
                    call()
                end.record()
                torch.cuda.synchronize()
                ms = start.elapsed_time(end) / 5
                best = max(best, sms * blocks_per_sm * warps * iters * 8 * flops / (ms * 1e-3) / 1e12)
        results[op] = (best, native(op, arch, sass_summary(cubin)))
    base = results["bf16 m16n8k16"][0]
    rows = [f"{torch.cuda.get_device_name()} (sm_{arch}, {sms} SMs)", "| op | TFLOPS | / bf16 | native on this GPU |", "|---|---|---|---|"]
    rows += [f"| {op} | {tf:.1f} | {tf / base:.2f} | {'yes' if nat else 'no: lowered, not an FP8 rate'} |" for op, (tf, nat) in results.items()]
    rows += [f"{op}: not launched at {', '.join(sorted(set(w)))} per block (too many registers)" for op, w in skipped.items()]
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sass", action="store_true", help="compile for sm_90a and sm_120a and read the SASS (no GPU)")
    args = parser.parse_args(argv)
    print("\n".join(sass_table() if args.sass else rates()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
