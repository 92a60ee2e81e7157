#!/usr/bin/env python3
"""GPU probe of the FP8 forward's `pv_fp8` knob (kernels/fp8_forward_sm120.py: P V on e4m3 mma.sync m16n8k32)
against the same kernel with P V on bf16 (pv_fp8=False), on small shapes, with inputs that show where P's weights
land if the P -> A-fragment / V^T mapping is still wrong.

    FLASH_ATTENTION_ARCH=sm_120 python3 docs/measurements/data/2026-12-06-fp8-pv-probe.py           # GPU, < 3 min
    uv run python docs/measurements/data/2026-12-06-fp8-pv-probe.py --dry-run [HYPOTHESIS]            # CPU

Three parts, each run with pv_fp8 and without it (the bf16-P V kernel, which passed the FP8 gate on an H100):

1. one-hot: softmax_scale 1, Q row m = 8 e_f(m), K row j = 8 e_j, V = identity (64 keys, head dim 64): P is one-hot
   (key f(m) for row m: 448 in e4m3, every other key exp(-64) -> 0), so O[m] = V[f(m)] = e_f(m), and with pv_fp8
   O[m, n] is exactly the weight the MMA paired with key n in row m. The table lists, for the first 16-row group,
   the keys each row's output holds against what each hypothesis below predicts.
2. uniform: Q = 0, so P = 1 on every key, O = the mean of V (channels of different scales): any pairing of P's
   keys and rows with V's keys gives the same O here; if this part fails where one-hot does too, the error is on
   V's side (V^T's global / shared layout, the B operand's ldmatrix, the epilogue's per-channel scales), not P's.
3. random: the FP8 gate's normal and scattered-outlier inputs on small prefill shapes (d64 / d128, causal or not,
   GQA 2, tiles 64x64 and 64x128): the FP8 gate against fp32, and pv_fp8's output against the bf16-P V output.
And V^T as each pv_fp8 call got it (on a GPU from the fused Triton kernel) against the torch path's on the CPU.

Every output is also compared with a CPU emulation of the kernel (the online softmax tile by tile in the kernel's
order, P x 448 rounded to e4m3, V^T from fa4tune.fp8.quantize_v) under each hypothesis of how the MMA pairs P and V:
the distance to each says which the GPU follows.

  correct           A's k = 16 h + 4 t + i holds P[row, pv_key_order[k]], B's k holds V^T[pv_key_order[k]]
  p_storage_order   the first version's bug: A's registers packed from the e4m3 P in the S accumulator's (C) order,
                    a0 = tile 0's (row g: c0, c1; row g + 8: c0, c1) (seen in its PTX; tests/test_fp8_kernel.py)
  cvt_byte_swap     the two e4m3 of each cvt.rn.satfinite.e4m3x2.f32 swapped
  vt_natural_keys   V^T's keys in natural order where the kernel expects pv_key_order (host / kernel disagree)
  b_k_halves        B's k 0-15 and 16-31 swapped (V^T's 16-byte chunks or ldmatrix's matrices)
(p_storage_order as emulated is the 64-row tiles' case, one m16 tile per warp; every part here runs tile_m 64.)
On random inputs p_storage_order and vt_natural_keys give similar errors (rel L2 ~1, cosine ~0.5-0.6); the one-hot
part tells them apart.

Exit status 0 when every pv_fp8 output matches the bf16-P V output within FP8's error (one-hot within 0.02 max abs;
uniform within rel L2 0.01 of the emulation and 0.08 of bf16 P V; random within rel L2 0.08 and cosine 0.995 of
bf16 P V, and the FP8 gate; V^T as the torch path makes it), 1 otherwise; 2 without a GPU (use --dry-run).
--dry-run [HYPOTHESIS] runs everything on the CPU with the emulation standing in for the kernel (the pv_fp8 kernel
by HYPOTHESIS, default `correct`; the bf16-P V kernel by fp32 attention on the dequantized Q / K): it checks the
probe itself, and with `p_storage_order` shows what the first version's output looks like here.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("FLASH_ATTENTION_ARCH", "sm_120")

import torch  # noqa: E402

from fa4tune import fp8  # noqa: E402
from fa4tune.config import ForwardConfig  # noqa: E402
from fa4tune.harness import fp8_gate, gate  # noqa: E402

ORDER = torch.tensor(fp8.pv_key_order())


def hypotheses() -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per hypothesis, over one m16n8k32 (16 rows m, 32 k): (P's row in the 16, P's key in the 32) that A[m, k] holds,
    and V's key in the 32 that B[k, :] holds."""
    m = torch.arange(16)[:, None].expand(16, 32)
    k = torch.arange(32)[None, :].expand(16, 32)
    g, r, t, i, h = m % 8, m // 8, (k % 16) // 4, k % 4, k // 16
    x = r + 2 * h  # the A register a_x (a0: row g, k 0-15; a1: row g + 8; a2, a3: k 16-31)
    return {
        "correct": (m, ORDER[k], ORDER[k]),
        "p_storage_order": (g + 8 * (i // 2), 8 * x + 2 * t + i % 2, ORDER[k]),
        "cvt_byte_swap": (m, ORDER[k ^ 1], ORDER[k]),
        "vt_natural_keys": (m, ORDER[k], k),
        "b_k_halves": (m, ORDER[k], ORDER[k ^ 16]),
    }


def emulate(quantized: tuple, causal: bool, scale: float, config: ForwardConfig, seqlen_k: int, hypothesis: str,
            device) -> torch.Tensor:
    """The pv_fp8 kernel's output (batch, seqlen_q, heads, dim_v) fp32 under `hypothesis`, from the quantized inputs:
    S from the dequantized Q / K tiles, the online softmax over key tiles from the last to the first (as the kernel
    runs them), P = exp(S - running max) x 448 to e4m3, paired with V^T's e4m3 by the hypothesis in every 16 rows x 32
    keys, the row sums from the unrounded P, O x V's scale / 448 / row sum."""
    qq, qs, kq, ks, _, vt, vs = quantized
    q = fp8.dequantize_per_tile(qq, qs, config.tile_m).to(device)
    k = fp8.dequantize_per_tile(kq, ks, config.tile_n).to(device)
    vt, vs = vt.to(device), vs.to(device)
    b, sq, h, _ = q.shape
    hk, dv, padded = vt.shape[1], vt.shape[2], vt.shape[3]
    group = h // hk
    assert sq % 16 == 0, "the emulation takes whole 16-row groups"
    src_row, src_key, v_key = (x.to(device) for x in hypotheses()[hypothesis])
    vpos = vt.float().permute(0, 1, 3, 2)  # (b, hk, positions, dv), e4m3 values
    vkey = torch.empty_like(vpos)
    vkey[:, :, fp8.vt_keys(padded, device)] = vpos  # by key
    vkey = vkey.repeat_interleave(group, dim=1)  # (b, h, keys, dv)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k.repeat_interleave(group, dim=2)) * scale
    s = torch.nn.functional.pad(s, (0, padded - seqlen_k), value=float("-inf"))
    if causal:  # bottom-right aligned
        keep = torch.ones(sq, padded, dtype=torch.bool, device=device).tril(seqlen_k - sq)
        s = s.masked_fill(~keep, float("-inf"))
    tn = config.tile_n
    m_run = torch.full((b, h, sq), float("-inf"), device=device)
    l_run = torch.zeros(b, h, sq, device=device)
    acc = torch.zeros(b, h, sq, dv, device=device)
    for nb in reversed(range(padded // tn)):
        sb = s[..., nb * tn:(nb + 1) * tn]
        m_new = torch.maximum(m_run, sb.amax(-1))
        m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)  # a row with no key yet
        corr = torch.exp(m_run - m_safe)
        acc, l_run = acc * corr[..., None], l_run * corr
        p = torch.exp(sb - m_safe[..., None])
        l_run = l_run + p.sum(-1)
        p8 = (p * fp8.FP8_MAX).to(torch.float8_e4m3fn).float().view(b, h, sq // 16, 16, tn // 32, 32)
        a = p8[:, :, :, src_row, :, src_key].permute(2, 3, 4, 0, 5, 1)  # (b, h, groups, 16, k-blocks, 32)
        blk = nb * tn + 32 * torch.arange(tn // 32, device=device)[:, None] + v_key[0][None, :]  # (k-blocks, 32)
        acc = acc + torch.einsum("bhgmKk,bhKkd->bhgmd", a, vkey[:, :, blk]).reshape(b, h, sq, dv)
        m_run = m_new
    out = acc * vs.repeat_interleave(group, dim=1)[:, :, None, :] / fp8.FP8_MAX / l_run[..., None]
    return out.permute(0, 2, 1, 3)


def config_of(tile_m: int, tile_n: int, stages: int, pv: bool) -> ForwardConfig:
    return ForwardConfig(tile_m=tile_m, tile_n=tile_n, num_threads=128, num_stages=stages, Q_in_regs=False,
                         kernel="sm120_fp8", extra={"pv_fp8": pv})


class Runner:
    """The two kernels (or, dry, their stand-ins) on bf16 q, k, v: (out fp32, quantized inputs of the pv_fp8 call).
    Each pv_fp8 call's V^T (on a GPU from the fused Triton kernel, fa4tune.fp8.fused_quantize_v, never checked on a
    GPU before) is compared with the torch path's on the CPU (quantize_v): `vt_report` rows."""

    def __init__(self, dry: str | None, device):
        self.dry, self.device = dry, device
        self.vt_report: list[tuple[str, int, int, float]] = []

    def check_vt(self, v, tile_n, vt, vs) -> None:
        vt_cpu, vs_cpu = fp8.quantize_v(v.cpu(), tile_n)
        differ = int((vt.cpu().view(torch.uint8) != vt_cpu.view(torch.uint8)).sum())
        back = fp8.dequantize_v(vt.cpu(), vs.cpu(), v.shape[1])
        ref = fp8.dequantize_v(vt_cpu, vs_cpu, v.shape[1])
        worst = ((back - ref).abs() / ref.abs().clamp_min(vs_cpu.max().item())).max().item()
        self.vt_report.append((f"{tuple(v.shape)} tile_n {tile_n}", differ, vt.numel(), worst))

    def run(self, q, k, v, causal, scale, tile, pv: bool):
        config = config_of(*tile, pv)
        fp8.check_call(q, k, v, causal, config)
        quantized = fp8.quantize_inputs(q, k, config, scale, v)
        if pv:
            self.check_vt(v, config.tile_n, *quantized[5:])
        if self.dry is None:
            out, _ = fp8.attention_fp8_quantized(quantized, v, causal, scale, config)
            torch.cuda.synchronize()
            return out.float(), quantized
        if pv:
            return emulate(quantized, causal, scale, config, k.shape[1], self.dry, self.device), quantized
        qq, qs, kq, ks, *_ = quantized
        ref = gate.reference_attention(fp8.dequantize_per_tile(qq, qs, config.tile_m),
                                       fp8.dequantize_per_tile(kq, ks, config.tile_n), v, causal, scale)
        return ref.out.float(), quantized


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def matches(out: torch.Tensor, quantized, causal, scale, tile, seqlen_k) -> dict[str, float]:
    """rel L2 of `out` against each hypothesis' emulation."""
    config = config_of(*tile, True)
    return {name: rel_l2(out, emulate(quantized, causal, scale, config, seqlen_k, name, out.device))
            for name in hypotheses()}


def best(found: dict[str, float]) -> str:
    name = min(found, key=found.get)
    return f"{name} ({found[name]:.3g})"


def keys_held(row: torch.Tensor, threshold: float = 0.25) -> str:
    idx = (row.abs() > threshold).nonzero().flatten().tolist()
    return " ".join(f"{j}:{row[j]:.2f}" for j in idx) or "-"


def one_hot_part(runner: Runner, failures: list) -> None:
    print("\n## 1. one-hot P, V = identity (d 64, 128 queries, 64 keys, tile 64x64): O[m] shows the keys row m got")
    dev = runner.device
    gen = torch.Generator().manual_seed(1)
    f = torch.cat([torch.randperm(64, generator=gen), torch.randperm(64, generator=gen)])  # row m's key
    q = torch.zeros(1, 128, 1, 64)
    q[0, torch.arange(128), 0, f] = 8.0
    k = (8.0 * torch.eye(64))[None, :, None, :]
    v = torch.eye(64)[None, :, None, :]
    q, k, v = (t.to(torch.bfloat16).to(dev) for t in (q, k, v))
    tile = (64, 64, 2)
    out_pv, quantized = runner.run(q, k, v, False, 1.0, tile, True)
    out_bf, _ = runner.run(q, k, v, False, 1.0, tile, False)
    want = torch.zeros(128, 64, device=dev)
    want[torch.arange(128), f.to(dev)] = 1.0
    config = config_of(*tile, True)
    predicted = {name: emulate(quantized, False, 1.0, config, 64, name, dev)[0, :, 0] for name in hypotheses()}
    print("| row | its key | bf16 P V holds | pv_fp8 holds | " + " | ".join(predicted) + " |")
    print("|---|---|---|---|" + "---|" * len(predicted))
    for m in range(16):
        print(f"| {m} | {f[m].item()} | {keys_held(out_bf[0, m, 0])} | {keys_held(out_pv[0, m, 0])} | "
              + " | ".join(keys_held(p[m]) for p in predicted.values()) + " |")
    err_pv = (out_pv[0, :, 0] - want).abs().max().item()
    err_bf = (out_bf[0, :, 0] - want).abs().max().item()
    rows_ok = int(((out_pv[0, :, 0] - want).abs().amax(-1) < 0.02).sum())
    found = {name: rel_l2(out_pv[0, :, 0], p) for name, p in predicted.items()}
    print(f"\nmax |O - e_f(m)|: bf16 P V {err_bf:.4f}, pv_fp8 {err_pv:.4f}; pv_fp8 rows right {rows_ok}/128; "
          f"pv_fp8 nearest hypothesis: {best(found)}")
    print("pv_fp8 rel L2 to each hypothesis: " + ", ".join(f"{n} {x:.3g}" for n, x in found.items()))
    if err_pv > 0.02:
        failures.append(f"one-hot: pv_fp8 max error {err_pv:.3f}, nearest hypothesis {best(found)}")
    if err_bf > 0.02:
        failures.append(f"one-hot: the bf16-P V kernel itself is off ({err_bf:.3f}): the inputs, not pv_fp8")


def uniform_part(runner: Runner, failures: list) -> None:
    print("\n## 2. uniform P (Q = 0), V normal x per-channel scale (d 64, 64 queries, 128 keys, tile 64x64)")
    dev = runner.device
    gen = torch.Generator().manual_seed(2)
    q = torch.zeros(1, 64, 1, 64)
    k = torch.randn(1, 128, 1, 64, generator=gen)
    v = torch.randn(1, 128, 1, 64, generator=gen) * (1 + torch.arange(64) / 8)
    q, k, v = (t.to(torch.bfloat16).to(dev) for t in (q, k, v))
    tile = (64, 64, 2)
    out_pv, quantized = runner.run(q, k, v, False, 0.125, tile, True)
    out_bf, _ = runner.run(q, k, v, False, 0.125, tile, False)
    emu = emulate(quantized, False, 0.125, config_of(*tile, True), 128, "correct", dev)
    col_ratio = (out_pv[0, :, 0] / emu[0, :, 0]).median(dim=0).values
    r_emu, r_bf = rel_l2(out_pv, emu), rel_l2(out_pv, out_bf)
    spread = (out_pv[0, :, 0] - out_pv[0, :, 0].mean(0)).abs().max().item()
    print(f"pv_fp8 rel L2 to the emulation {r_emu:.2e}, to bf16 P V {r_bf:.2e} (bf16 P V to the emulation "
          f"{rel_l2(out_bf, emu):.2e}); rows differ by at most {spread:.2e} (all rows should be equal)")
    print("per-column pv_fp8 / emulation (median over rows), columns 0..63:")
    print(" ".join(f"{x:.3f}" for x in col_ratio.tolist()))
    if r_emu > 0.01 or r_bf > 0.08:
        failures.append(f"uniform: pv_fp8 rel L2 {r_emu:.3g} to the emulation, {r_bf:.3g} to bf16 P V: the V side "
                        "(V^T layout / B operand / epilogue scales) is wrong")


def random_part(runner: Runner, failures: list) -> None:
    print("\n## 3. random inputs (the FP8 gate's kinds), batch 1, 4 heads, GQA 2")
    print("| shape | tile | inputs | bf16 P V gate rel L2 / cos | pv_fp8 gate rel L2 / cos | pv_fp8 vs bf16 P V "
          "rel L2 / min cos | pv_fp8 nearest hypothesis | gates |")
    print("|---|---|---|---|---|---|---|---|")
    dev = runner.device
    for d, seqlen, causal, tile in [(64, 512, False, (64, 64, 2)), (128, 512, True, (64, 64, 2)),
                                    (64, 1024, True, (64, 128, 2))]:
        shapes = [(1, seqlen, 4, d), (1, seqlen, 2, d), (1, seqlen, 2, d)]
        scale = d ** -0.5
        for kind in ("normal", "outliers"):
            gen = torch.Generator(device=dev).manual_seed(0)
            if kind == "normal":
                q, k, v = (torch.randn(s, generator=gen, device=dev).to(torch.bfloat16) for s in shapes)
            else:
                q, k, v = fp8_gate.outlier_inputs(shapes, torch.bfloat16, gen, dev)
            ref = gate.reference_attention(q, k, v, causal)
            out_pv, quantized = runner.run(q, k, v, causal, scale, tile, True)
            out_bf, _ = runner.run(q, k, v, causal, scale, tile, False)
            g_pv = fp8_gate.check(out_pv, None, ref.out, None)
            g_bf = fp8_gate.check(out_bf, None, ref.out, None)
            r, c = fp8_gate.head_errors(out_pv, out_bf)
            found = matches(out_pv, quantized, causal, scale, tile, seqlen)
            ok = g_pv.passed and r.max().item() <= 0.08 and c.min().item() >= 0.995
            name = f"d{d} s{seqlen}{' causal' if causal else ''}"
            print(f"| {name} | {tile[0]}x{tile[1]}s{tile[2]} | {kind} | {g_bf.rel_l2:.4f} / {g_bf.cos:.5f} | "
                  f"{g_pv.rel_l2:.4f} / {g_pv.cos:.5f} | {r.max().item():.4f} / {c.min().item():.5f} | {best(found)} | "
                  f"{'ok' if ok else 'FAIL'} |", flush=True)
            if not ok:
                failures.append(f"random {name} {kind}: pv_fp8 rel L2 {g_pv.rel_l2:.3f} (gate {g_pv.passed}), "
                                f"{r.max().item():.3f} to bf16 P V, nearest {best(found)}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", nargs="?", const="correct", default=None, choices=list(hypotheses()),
                        help="CPU: the emulation under HYPOTHESIS (default correct) stands in for the pv_fp8 kernel")
    args = parser.parse_args(argv)
    start = time.time()
    if args.dry_run is None:
        if not torch.cuda.is_available():
            print("no GPU: run with --dry-run on the CPU", file=sys.stderr)
            return 2
        device = torch.device("cuda")
        print(f"# pv_fp8 probe on {torch.cuda.get_device_name()} (FLASH_ATTENTION_ARCH="
              f"{os.environ.get('FLASH_ATTENTION_ARCH')})")
    else:
        device = torch.device("cpu")
        print(f"# pv_fp8 probe, DRY RUN on the CPU: the pv_fp8 kernel is the emulation under {args.dry_run!r}")
    runner, failures = Runner(args.dry_run, device), []
    for part in (one_hot_part, uniform_part, random_part):
        try:
            part(runner, failures)
        except Exception as err:  # noqa: BLE001 - report and go on to the next part
            import traceback

            traceback.print_exc()
            failures.append(f"{part.__name__}: {type(err).__name__}: {err}")
    print("\n## V^T as the pv_fp8 calls got it (GPU: the fused Triton kernel) against the torch path on the CPU")
    print("| v | bytes differing | of | worst dequantized difference (relative, floor: the largest scale) |")
    print("|---|---|---|---|")
    for name, differ, total, worst in runner.vt_report:
        print(f"| {name} | {differ} | {total} | {worst:.3g} |")
        if differ > total // 1000 or worst > 0.13:  # more than a stray last-bit rounding: e4m3's step is 1/8
            failures.append(f"V^T of {name}: {differ} of {total} bytes differ from the torch path, worst {worst:.3g}")
    print(f"\n{time.time() - start:.0f} s")
    if failures:
        print("FAIL:\n- " + "\n- ".join(failures))
        return 1
    print("PASS: pv_fp8 matches the bf16-P V kernel within FP8's error on every part")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
