"""What a backward CTA costs besides its tile pairs (issue 44): the SM120 backward runs one CTA per key block and head,
looping over the query blocks it sees; its prologue (K and V into shared memory, the first Q / dO / LSE) and its
epilogue (dK and dV out) are paid once a CTA, and at one CTA per SM (99 KB of shared memory) nothing overlaps them.
A causal key block sees half the query blocks of a non-causal one on average, so that fixed cost weighs twice as much
there: a candidate for the gap between the causal d128 entry (1.66-1.81x its shared-memory floor) and the non-causal
ones (1.51-1.59x), `2026-12-06-backward-shared-floor.md`.

The probe holds the CTA count fixed (batch x seqlen = 32,768 tokens, 16 heads, d128) and varies the sequence length, so
the tile pairs grow with it: the main kernel's time (the device time of the longest kernel of the backward call,
without the dPsum preprocess and the dQ postprocess; torch.profiler through bench/gpu_call_profile.py) against the
pairs is a line whose intercept is what the CTAs pay once each (prologue, epilogue, and for causal the masked
diagonal pair's extra work). Per mask and per config (the table's entry, upstream's default).

    FLASH_ATTENTION_ARCH=sm_120 FLASH_ATTENTION_NUM_SMS=132 python3 docs/measurements/data/2026-12-06-bwd-cta-cost-probe.py
    python3 docs/measurements/data/2026-12-06-bwd-cta-cost-probe.py --dry-run     # the shapes, counts and the fit, CPU

The first GPU run (2026-12-06-h100-s5-fp8pv-cta-ut1.md section 2) put the fixed cost at 1.1-1.6 pairs' time a CTA,
2.4-4.6 % of the causal entry's main kernel on the standard problems: too little for the gap. `--calls` looks at the
rest of the call on the standard d128 problems themselves: every kernel of one backward call (the dPsum preprocess
that also zeroes the fp32 dQ buffer, the main kernel, the dQ postprocess): what lies outside the main kernel, and
the main kernel's time a pair at those shapes (wave quantization and the causal CTAs' unequal lengths included). Its
run: 2026-12-06-h100-s6-bwdcalls-ut.md section 1 (82 us outside the main kernel on every problem, too little).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

TOKENS, HEADS, DIM = 32768, 16, 128
SEQLENS = (512, 1024, 2048, 4096, 8192)


def counts(seqlen: int, causal: bool, m_block: int, n_block: int) -> tuple[int, int]:
    """(CTAs, tile pairs the CTAs visit) for batch TOKENS / seqlen: one CTA per key block and head; a causal key block
    j starts at the query block holding its first key (BlockInfo: m_block_min = j * n_block // m_block)."""
    batch = TOKENS // seqlen
    n_blocks, m_blocks = -(-seqlen // n_block), -(-seqlen // m_block)
    per_head = sum(m_blocks - (j * n_block // m_block if causal else 0) for j in range(n_blocks))
    return batch * HEADS * n_blocks, batch * HEADS * per_head


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares ms = a + b * pairs: (a, b)."""
    xs, ys = [p for p, _ in points], [t for _, t in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def configs(causal: bool):
    """(name, backward config) pairs: the table's entry for d128 bf16 of this mask, upstream's default."""
    import experiment
    from fa4tune import defaults
    from fa4tune.config import ProblemClass

    pc = ProblemClass(DIM, DIM, causal)
    return [("table", experiment.backward_config(pc)), ("upstream", defaults.upstream_backward(pc))]


def main_kernel_ms(run, calls: int = 10) -> float:
    """The longest kernel of `run` (one backward call): its mean device time over `calls` profiled calls, in ms
    (bench/gpu_call_profile.py's profiler)."""
    from bench.gpu_call_profile import profile

    per_kernel, _, _ = profile(run, calls)
    return max(per_kernel.values()) / 1000


def backward_call(batch: int, seqlen: int, causal: bool, config):
    """One backward call of a d128 bf16 problem with `config`, as a function of no arguments."""
    import torch

    import experiment

    torch.manual_seed(0)
    q, k, v = (torch.randn(batch, seqlen, HEADS, DIM, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    out = experiment.attention(q, k, v, causal=causal, bwd_config=config)
    grad = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)


def measure(causal: bool, config, seqlen: int) -> float:
    return main_kernel_ms(backward_call(TOKENS // seqlen, seqlen, causal, config))


def report(rows: list[tuple[str, bool, object, list[tuple[int, int, int, float]]]], sms: int) -> list[str]:
    """The table per (mask, config) and the fit: the fixed cost per CTA (in units of one pair's time on an SM, and in
    microseconds) and its share of the time at each length."""
    lines = ["| mask | config | seqlen | CTAs | pairs | main kernel ms | fixed share |", "|---|---|---|---|---|---|---|"]
    summary = []
    for name, causal, config, points in rows:
        a, b = fit([(pairs, ms) for _, _, pairs, ms in points])
        for seqlen, ctas, pairs, ms in points:
            lines.append(f"| {'causal' if causal else 'non-causal'} | {name} | {seqlen} | {ctas} | {pairs} | {ms:.4f} | "
                         f"{a / ms:.1%} |")
        ctas = points[0][1]
        per_cta_us = a * 1000 * sms / ctas  # the intercept spread over the CTAs an SM runs one after another
        per_pair_us = b * 1000 * sms
        summary.append(f"{'causal' if causal else 'non-causal'} {name} ({config.m_block_size}x{config.n_block_size} "
                       f"t{config.num_threads}): fixed {a:.4f} ms = {per_cta_us:.2f} us a CTA = "
                       f"{per_cta_us / per_pair_us:.1f} pairs' time; a pair {per_pair_us:.3f} us on one SM")
    return lines + [""] + summary


PROBLEMS = ((1, 8192), (2, 4096))  # the standard suite's d128 problems (batch, seqlen), 16 heads


def calls_report(rows: list[tuple[str, bool, object, int, int, dict]], sms: int) -> list[str]:
    """One line per (problem, mask, config): the main kernel (the longest), the rest of the call's kernels, their
    share of the kernels' sum, and the main kernel's time a pair on one SM; rows are (problem, causal, config, CTAs,
    pairs, {kernel: us}). No span: under the profiler a call's host path can leave gaps between its kernels longer
    than the gap that separates calls (bench/gpu_call_profile.call_spans), which made the first run's spans wrong."""
    lines = ["| problem | mask | config | main us | other kernels us | outside main | main us a pair on one SM |",
             "|---|---|---|---|---|---|---|"]
    for problem, causal, config, ctas, pairs, kernels in rows:
        main = max(kernels.values())
        others = sum(kernels.values()) - main
        lines.append(f"| {problem} | {'causal' if causal else 'non-causal'} | {config.m_block_size}x{config.n_block_size} "
                     f"t{config.num_threads} | {main:.1f} | {others:.1f} | {others / (main + others):.1%} | "
                     f"{main * sms / pairs:.3f} |")
    lines.append("")
    for problem, causal, config, _, _, kernels in rows:
        lines.append(f"{problem} {'causal' if causal else 'non-causal'} {config.m_block_size}x{config.n_block_size}: "
                     + "; ".join(f"{name[:60]} {us:.1f}" for name, us in sorted(kernels.items(), key=lambda kv: -kv[1])))
    return lines


def calls(sms: int) -> list[str]:
    """--calls on the GPU: each standard d128 problem's backward call, profiled kernel by kernel."""
    from bench.gpu_call_profile import profile

    rows = []
    for batch, seqlen in PROBLEMS:
        for causal in (False, True):
            for name, config in configs(causal):
                kernels, _, _ = profile(backward_call(batch, seqlen, causal, config), 10)
                n_blocks = -(-seqlen // config.n_block_size)
                per_batch = counts(seqlen, causal, config.m_block_size, config.n_block_size)[1] // (TOKENS // seqlen)
                rows.append((f"b{batch} s{seqlen} {name}", causal, config, batch * HEADS * n_blocks,
                             batch * per_batch, kernels))
                print(f"{rows[-1][0]} {'causal' if causal else 'non-causal'}: main {max(kernels.values()):.1f} us",
                      flush=True)
    return calls_report(rows, sms)


def dry_run() -> int:
    """The shapes and counts, and the fit on synthetic times (2 us a CTA, 0.9 us a pair on 132 SMs): the fit must
    give them back."""
    from fa4tune.config import BackwardConfig

    cfg = BackwardConfig(m_block_size=64, n_block_size=64, num_stages_Q=2, num_stages_dO=1, num_threads=256,
                         SdP_swapAB=False, dKV_swapAB=False, dQ_swapAB=True, AtomLayoutMSdP=4, AtomLayoutNdKV=2,
                         AtomLayoutMdQ=2, V_in_regs=False)
    rows = []
    for causal in (False, True):
        points = []
        for seqlen in SEQLENS:
            ctas, pairs = counts(seqlen, causal, 64, 64)
            points.append((seqlen, ctas, pairs, (ctas * 2.0 + pairs * 0.9) / 132 / 1000))
        rows.append(("synthetic", causal, cfg, points))
    print("\n".join(report(rows, 132)))
    a, b = fit([(p, ms) for _, _, p, ms in rows[1][3]])
    assert abs(a * 1000 * 132 / rows[1][3][0][1] - 2.0) < 1e-6 and abs(b * 1000 * 132 - 0.9) < 1e-9
    print("dry run ok: the fit gives the synthetic costs back")
    ctas, pairs = counts(4096, True, 64, 64)
    lines = calls_report([("b2 s4096 synthetic", True, cfg, ctas // 4, pairs // 4,
                           {"preprocess": 40.0, "main": 1250.0, "postprocess": 60.0})], 132)
    print("\n".join(lines))
    assert "| 1250.0 | 100.0 | 7.4% |" in lines[2], lines[2]
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="no GPU: the shapes, the counts and the fit")
    parser.add_argument("--calls", action="store_true", help="each standard d128 problem's call, kernel by kernel")
    args = parser.parse_args(argv)
    if args.dry_run:
        return dry_run()
    import torch

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if args.calls:
        print("\n".join(calls(sms)))
        print(f"{torch.cuda.get_device_name(0)}; SM120 kernels emulated where not SM 12.0 (FLASH_ATTENTION_ARCH=sm_120)")
        return 0
    rows = []
    for causal in (False, True):
        for name, config in configs(causal):
            points = []
            for seqlen in SEQLENS:
                ctas, pairs = counts(seqlen, causal, config.m_block_size, config.n_block_size)
                ms = measure(causal, config, seqlen)
                points.append((seqlen, ctas, pairs, ms))
                print(f"{'causal' if causal else 'non-causal'} {name} s{seqlen}: {ms:.4f} ms", flush=True)
            rows.append((name, causal, config, points))
    print("\n".join(report(rows, sms)))
    print(f"{torch.cuda.get_device_name(0)}; SM120 kernels emulated where not SM 12.0 (FLASH_ATTENTION_ARCH=sm_120)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
