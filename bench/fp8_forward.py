"""The FP8 forward class (kernel "sm120_fp8", fa4tune.fp8.attention_fp8; issue 45) on a suite's prefill problems:
each config gated under the FP8 gate (fa4tune.harness.fp8_gate: per head against fp32 on the unquantized inputs;
normal, scattered outliers, large channels), then timed against the bf16 table's forward (experiment.attention) on the
same problem, interleaved rounds of CUDA events: the kernel on inputs quantized once (attention_fp8_quantized) and the
whole call with K's smoothing and the quantization (attention_fp8).

    python3 bench/fp8_forward.py [--suite standard] [--only SUBSTRING] [--configs 128x64s1,64x64s1] [--rounds 20]
    uv run python bench/fp8_forward.py --dry-run   # CPU: every step on small shapes, fp32 attention for the kernel

A config is "TILE_MxTILE_Ns STAGES" at 128 threads, "p" after it for P V on e4m3 (pv_fp8); the default is fa4tune.fp8.default_config per head dim. A config the
FP8 rules refuse for a problem is reported with its rule, a config that fails the gate on any input is not timed. On
an H100 or H200 e4m3 mma.sync is lowered to fp16 (bench/mma_rate.py: 0.64x bf16 on an H100), so an emulated time is
the FP8 path's cost there, not SM120's FP8 rate. --dry-run replaces the kernel with fp32 attention on the dequantized
tiles (what it computes; with pv_fp8 V dequantized and P rounded to e4m3 too) and shrinks each problem to 256 tokens
and 2 K/V heads (--dry-seqlen).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fa4tune import fp8  # noqa: E402
from fa4tune.config import ConfigError, DECODE_MAX_SEQLEN_Q, ForwardConfig  # noqa: E402
from fa4tune.harness import fp8_gate, gate  # noqa: E402
from fa4tune.suites import load_suite  # noqa: E402

KINDS = ("normal", "outliers", "channels")


def parse_configs(text: str) -> list[ForwardConfig | None]:
    """'128x64s1,64x64s2p' -> configs (128 threads; a trailing p: P V on e4m3, the pv_fp8 knob); 'default' -> None
    (fa4tune.fp8.default_config per head dim)."""
    configs = []
    for item in filter(None, text.split(",")):
        if item == "default":
            configs.append(None)
            continue
        m = re.fullmatch(r"(\d+)x(\d+)s(\d)(p?)", item)
        if not m:
            raise ConfigError("fp8_config", "a config is TILE_MxTILE_NsSTAGES[p] (e.g. 128x64s1, 64x64s2p) or 'default', "
                              f"got {item!r}")
        configs.append(ForwardConfig(tile_m=int(m[1]), tile_n=int(m[2]), num_threads=128, num_stages=int(m[3]),
                                     Q_in_regs=False, kernel="sm120_fp8", extra={"pv_fp8": bool(m[4])}))
    return configs


def label(config: ForwardConfig) -> str:
    return f"{config.tile_m}x{config.tile_n}s{config.num_stages}{'p' if fp8.pv_fp8(config) else ''}"


def inputs(problem, kind: str, device: str, seed: int = 0) -> list[torch.Tensor]:
    shapes = [(problem.batch, problem.seqlen_q, problem.num_heads, problem.head_dim),
              (problem.batch, problem.seqlen_k, problem.num_heads_kv, problem.head_dim),
              (problem.batch, problem.seqlen_k, problem.num_heads_kv, problem.head_dim_v)]
    generator = torch.Generator(device=device).manual_seed(seed)
    if kind == "outliers":
        return fp8_gate.outlier_inputs(shapes, torch.bfloat16, generator, device)
    if kind == "channels":
        return fp8_gate.channel_outlier_inputs(*shapes, torch.bfloat16, generator, device)
    return [torch.randn(s, generator=generator, device=device).to(torch.bfloat16) for s in shapes]


def p_e4m3_attention(q, k, v, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 attention with P rounded as pv_fp8 rounds it: exp(S - row max) x 448 to e4m3, then / 448 (the kernel
    takes each block's running max, which rounds the same way, relative to the value, above e4m3's subnormals);
    the row sums from the unrounded P, as the kernel's. (batch, seqlen, heads, dim) inputs, GQA by repeating K/V."""
    group = q.shape[2] // k.shape[2]
    k, v = (t.float().repeat_interleave(group, dim=2) for t in (k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), k) * scale
    if causal:  # bottom-right aligned, as the gate's reference
        sq, sk = s.shape[-2:]
        s = s.masked_fill(~torch.ones(sq, sk, dtype=torch.bool, device=s.device).tril(sk - sq), float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    p = torch.exp(s - m)
    rows = p.sum(dim=-1, keepdim=True)
    p8 = (p * fp8.FP8_MAX).to(torch.float8_e4m3fn).float() / fp8.FP8_MAX
    return torch.einsum("bhqk,bkhd->bqhd", p8 / rows, v), (m + rows.log()).squeeze(-1)


def fp8_call(config: ForwardConfig, causal: bool, dry: bool):
    """(quantized inputs, v) -> (out, lse): the kernel, or on --dry-run fp32 attention on the dequantized tiles (and
    V, with P rounded to e4m3 as the kernel rounds it: p_e4m3_attention, with pv_fp8)."""
    def call(quantized, v, scale):
        if not dry:
            return fp8.attention_fp8_quantized(quantized, v, causal, scale, config)
        qq, qs, kq, ks, correction, *pv = quantized
        q, k = fp8.dequantize_per_tile(qq, qs, config.tile_m), fp8.dequantize_per_tile(kq, ks, config.tile_n)
        if pv:
            out, lse = p_e4m3_attention(q, k, fp8.dequantize_v(*pv, v.shape[1]), causal, scale)
            return out.to(torch.bfloat16), lse + correction
        ref = gate.reference_attention(q, k, v, causal, scale)
        return ref.out.to(torch.bfloat16), ref.lse + correction
    return call


def timed(calls: dict, rounds: int) -> dict:
    """Median ms per call of each candidate, the candidates interleaved in every round (CUDA events)."""
    times = {name: [] for name in calls}
    for fn in calls.values():  # warm up (and compile)
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
    parser.add_argument("--suite", default="standard")
    parser.add_argument("--only", default="")
    parser.add_argument("--configs", default="default", help="comma-separated TILE_MxTILE_NsSTAGES[p] or 'default'")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--dry-run", action="store_true", help="CPU: fp32 attention in place of the kernel, small shapes")
    parser.add_argument("--dry-seqlen", type=int, default=256, help="--dry-run's sequence length (default 256)")
    args = parser.parse_args(argv)
    configs = parse_configs(args.configs)
    device = "cpu" if args.dry_run else "cuda"
    problems = [p for p in load_suite(args.suite) if p.seqlen_q > DECODE_MAX_SEQLEN_Q and args.only in p.name]
    if args.dry_run:
        problems = [replace(p, batch=1, seqlen_q=args.dry_seqlen, seqlen_k=args.dry_seqlen,
                            num_heads=2 * (p.num_heads // p.num_heads_kv), num_heads_kv=2)
                    for p in problems]
    print("| problem | config | inputs | rel L2 | cos | LSE rel L2 | gate |")
    print("|---|---|---|---|---|---|---|")
    failed, passed = 0, []
    for p in problems:
        for given in configs:
            config = given or fp8.default_config(p.head_dim)
            scale = p.head_dim ** -0.5
            q, k, v = inputs(p, "normal", device)
            try:
                fp8.check_call(q, k, v, p.causal, config)
            except ConfigError as err:
                print(f"| {p.name} | {label(config)} | - | | | | refused: {err} |")
                continue
            call, ok = fp8_call(config, p.causal, args.dry_run), True
            for kind in KINDS:
                q, k, v = inputs(p, kind, device)
                ref = gate.reference_attention(q, k, v, p.causal)
                out, lse = call(fp8.quantize_inputs(q, k, config, scale, v), v, scale)
                check = fp8_gate.check(out.float(), lse, ref.out, ref.lse)
                ok &= check.passed
                print(f"| {p.name} | {label(config)} | {kind} | {check.rel_l2:.4f} | {check.cos:.5f} | {check.lse_rel_l2:.4f} | "
                      f"{'pass' if check.passed else 'FAIL: ' + check.reason} |", flush=True)
            failed += not ok
            if ok:
                passed.append((p, config))
    print(f"{len(passed)} of {len(passed) + failed} (problem, config) pairs pass the FP8 gate on every input kind")
    if args.dry_run or not passed:
        return 1 if failed else 0
    from fa4tune.harness.candidates import load_experiment
    from fa4tune.harness.settings import EXPERIMENT_PATH

    experiment = load_experiment(EXPERIMENT_PATH)  # the guards' checks first, as every measuring entry point
    print("\n| problem | config | bf16 table ms | fp8 kernel ms | fp8 whole call ms | kernel / table | whole / table |")
    print("|---|---|---|---|---|---|---|")
    for p, config in passed:
        q, k, v = inputs(p, "normal", device)
        scale = p.head_dim ** -0.5
        quantized = fp8.quantize_inputs(q, k, config, scale, v)
        ms = timed({"table": lambda: experiment.attention(q, k, v, causal=p.causal),
                    "kernel": lambda: fp8.attention_fp8_quantized(quantized, v, p.causal, scale, config),
                    "whole": lambda: fp8.attention_fp8(q, k, v, p.causal, scale, config)}, args.rounds)
        print(f"| {p.name} | {label(config)} | {ms['table']:.4f} | {ms['kernel']:.4f} | {ms['whole']:.4f} | "
              f"{ms['table'] / ms['kernel']:.3f}x | {ms['table'] / ms['whole']:.3f}x |", flush=True)
    print(f"{torch.cuda.get_device_name()}; SM120 kernels emulated where not SM 12.0 (FLASH_ATTENTION_ARCH=sm_120)")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
