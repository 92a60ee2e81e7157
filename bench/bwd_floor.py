"""The backward's floor per problem (issue 44): the work it cannot avoid and the time each part allows on a device.

For the backward upstream's SM120 class runs (flash_attn/cute/flash_bwd_sm120.py, SM80-style): one CTA per key block
of `n_block` keys and query head, looping over the query blocks of `m_block` rows it sees; per (query block, key
block) pair it loads Q, dO, LSE and dPsum, makes S = QK^T, dP = dO V^T, dV += P^T dO, dK += dS^T Q and adds
dQ += dS K into an fp32 buffer in global memory by atomics; a preprocess makes dPsum = rowsum(dO * O), a postprocess
turns the fp32 dQ into the output dtype. With GQA the per-query-head dK and dV are summed into fp32 buffers too.

    python3 bench/bwd_floor.py --suite standard [--device h200|rtx5090] [--m-block 64 --n-block 64]
        [--measured LOG]   # a bench/table_vs_upstream.py log: each problem's table and upstream times against the floor

Per problem: FLOPs (fa4tune.harness.flops, as every TFLOPS figure here counts them), the tile pairs the causal
mask leaves, the bytes that must cross HBM once (inputs, outputs, the fp32 dQ buffer, the pre/postprocess), the
bytes the pairs load from L2 (Q, dO, LSE, dPsum per pair; K, V per key block), the fp32 atomics, and the time floors:
FLOPs at the device's mma.sync rate, HBM bytes at its bandwidth.

    python3 bench/bwd_floor.py --shared [--table]   # the shared-memory floor of upstream's configs (or the table's)

--shared: the bytes one tile pair's five gemms read from shared memory (`shared_reads`: every warp reads its slice of
both operands once per gemm, ldmatrix), and that floor at 128 B per clock per SM (SM80 and later): on the H200 the
mma.sync rate outruns it, so a 64x64 d128 backward is bound by shared memory there, not by the tensor pipe.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fa4tune.config import BackwardConfig, Problem
from fa4tune.defaults import upstream_backward
from fa4tune.harness.flops import problem_flops
from fa4tune.suites import load_suite

# (mma.sync bf16 in / fp32 accumulate, TFLOPS; memory bandwidth, TB/s; where each figure comes from)
DEVICES = {
    "h200": (644.0, 4.8, "mma.sync measured by ../shared/probes/mma_rate.py (notes/h200-reference.md); HBM3e 4.8 TB/s (NVIDIA H200 datasheet)"),
    "rtx5090": (253.0, 1.792, "mma.sync bf16 about 253 TFLOPS measured (flashinfer issue #4149, as issue #45 cites); GDDR7 1.792 TB/s (NVIDIA RTX 5090 specifications)"),
}
# (SMs, boost clock GHz) for the shared-memory floor, 128 B per clock per SM (NVIDIA's tuning guides, SM80 and later)
SHARED = {"h200": (132, 1.98), "rtx5090": (170, 2.41)}
SHARED_BYTES_PER_CLOCK = 128
BF16 = 2
FP32 = 4


@dataclass(frozen=True)
class Floor:
    problem: Problem
    flops: float
    pairs: int  # (query block, key block) pairs computed, over all query heads
    hbm_bytes: int
    l2_load_bytes: int
    atomics: int  # fp32 atomic adds (dQ; with GQA, dK and dV too)

    def tensor_ms(self, tflops: float) -> float:
        return self.flops / (tflops * 1e12) * 1e3

    def hbm_ms(self, tb_per_s: float) -> float:
        return self.hbm_bytes / (tb_per_s * 1e12) * 1e3


def tile_pairs(seqlen_q: int, seqlen_k: int, causal: bool, m_block: int, n_block: int) -> int:
    """(query block, key block) pairs with at least one visible score (bottom-right aligned causal mask, as the
    kernels and fa4tune.harness.flops count it): query row r sees keys up to r + seqlen_k - seqlen_q."""
    m_blocks, n_blocks = -(-seqlen_q // m_block), -(-seqlen_k // n_block)
    if not causal:
        return m_blocks * n_blocks
    pairs = 0
    for i in range(m_blocks):
        last_row = min(seqlen_q, (i + 1) * m_block) - 1
        last_key = last_row + seqlen_k - seqlen_q  # the last key this block's last row sees
        if last_key >= 0:
            pairs += min(n_blocks, last_key // n_block + 1)
    return pairs


def floor(problem: Problem, m_block: int = 64, n_block: int = 64) -> Floor:
    b, hq, hk = problem.batch, problem.num_heads, problem.num_heads_kv
    sq, sk, d, dv = problem.seqlen_q, problem.seqlen_k, problem.head_dim, problem.head_dim_v
    pairs = b * hq * tile_pairs(sq, sk, problem.causal, m_block, n_block)
    n_blocks = -(-sk // n_block)
    q, k, v, o, do = b * hq * sq * d, b * hk * sk * d, b * hk * sk * dv, b * hq * sq * dv, b * hq * sq * dv
    stats = b * hq * sq  # LSE and dPsum, fp32 each
    hbm = (
        (q + k + v + do) * BF16 + stats * FP32  # the main kernel's inputs, read once
        + (q + k + v) * BF16  # dQ, dK, dV written
        + 2 * q * FP32  # the fp32 dQ buffer, written by the atomics and read by the postprocess
        + (o + do) * BF16 + stats * FP32  # the preprocess: dPsum from O and dO
    )
    gqa_sums = b * hq * sk * (d + dv) if hq != hk else 0  # per-query-head dK, dV summed in fp32
    hbm += 2 * gqa_sums * FP32
    l2 = pairs * (m_block * (d + dv) * BF16 + 2 * m_block * FP32) + b * hq * n_blocks * n_block * (d + dv) * BF16
    atomics = pairs * m_block * d + gqa_sums
    return Floor(problem, problem_flops(problem, "bwd"), pairs, hbm, l2, atomics)


def gemm_shared_reads(m: int, n: int, k: int, warps_m: int, warps_n: int, a_in_registers: bool = False,
                      b_in_registers: bool = False) -> int:
    """Bytes (bf16) the warps of one SM80 tiled MMA read from shared memory for an m x n x k gemm: each of the
    warps_m x warps_n warps loads its m/warps_m rows of A and n/warps_n columns of B over all of k. The tiles must
    hold whole 16 x 16 warp tiles (the static rules' *_mma_tile)."""
    if m % (16 * warps_m) or n % (16 * warps_n):
        raise ValueError(f"mma_tile: a {m} x {n} tile does not hold {warps_m} x {warps_n} warp tiles of 16 x 16")
    return ((0 if a_in_registers else warps_n * m) + (0 if b_in_registers else warps_m * n)) * k * BF16


def shared_reads(config: BackwardConfig, head_dim: int, head_dim_v: int) -> int:
    """Bytes one (query block, key block) pair's five gemms read from shared memory, as upstream's backward lays its
    warps (flash_bwd.py `_get_tiled_mma`; a swapped gemm reads the same bytes): S = QK^T and dP = dO V^T on the
    (AtomLayoutMSdP, warps / AtomLayoutMSdP) layout, dV = P^T dO and dK = dS^T Q on (AtomLayoutNdKV, ...) with P and
    dS from shared memory unless upstream keeps them in registers (Mma_dKV_is_RS), dQ = dS K on (AtomLayoutMdQ, ...),
    its K from registers in `sm120_cmask_kregs` (loaded once a CTA: not a pair's)."""
    c, w = config, config.num_threads // 32
    m, n, d, dv = c.m_block_size, c.n_block_size, head_dim, head_dim_v
    a_sdp, a_dkv, a_dq = c.AtomLayoutMSdP, c.AtomLayoutNdKV, c.AtomLayoutMdQ
    rs = a_sdp == 1 and a_dkv == w and c.SdP_swapAB and not c.dKV_swapAB
    return (gemm_shared_reads(m, n, d, a_sdp, w // a_sdp) + gemm_shared_reads(m, n, dv, a_sdp, w // a_sdp)
            + gemm_shared_reads(n, dv, m, a_dkv, w // a_dkv, rs) + gemm_shared_reads(n, d, m, a_dkv, w // a_dkv, rs)
            + gemm_shared_reads(m, d, n, a_dq, w // a_dq, b_in_registers=c.kernel == "sm120_cmask_kregs"))


def shared_ms(problem: Problem, config: BackwardConfig, device: str) -> float:
    """The time the pairs' shared-memory reads take at the device's 128 B per clock per SM, all SMs busy."""
    sms, ghz = SHARED[device]
    pairs = problem.batch * problem.num_heads * tile_pairs(problem.seqlen_q, problem.seqlen_k, problem.causal,
                                                           config.m_block_size, config.n_block_size)
    return pairs * shared_reads(config, problem.head_dim, problem.head_dim_v) / (sms * SHARED_BYTES_PER_CLOCK * ghz * 1e9) * 1e3


def measured_times(log: Path) -> dict[str, tuple[float, float]]:
    """{problem name: (table ms, upstream ms)} from a bench/table_vs_upstream.py log's backward lines (the median of
    its runs)."""
    found: dict[str, tuple[list, list]] = {}
    for line in log.read_text().splitlines():
        m = re.match(r"run \d+ (.+) bwd: table ok ([\d.]+) ms, upstream ok ([\d.]+) ms", line)
        if m:
            table, upstream = found.setdefault(m.group(1), ([], []))
            table.append(float(m.group(2)))
            upstream.append(float(m.group(3)))
    return {name: (statistics.median(t), statistics.median(u)) for name, (t, u) in found.items()}


def _header(suite: str, head: str):
    """Prints a markdown table's head; yields the suite's backward problems."""
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    yield from (p for p in load_suite(suite) if p.backward)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", default="standard")
    parser.add_argument("--device", choices=sorted(DEVICES), default="h200")
    parser.add_argument("--m-block", type=int, default=64)
    parser.add_argument("--n-block", type=int, default=64)
    parser.add_argument("--measured", type=Path, nargs="+", default=None, help="bench/table_vs_upstream.py logs")
    parser.add_argument("--shared", action="store_true", help="the shared-memory floor per problem instead")
    parser.add_argument("--table", action="store_true", help="with --shared: the dispatch table's configs, not upstream's")
    args = parser.parse_args(argv)
    if args.shared:
        return shared_table(args)
    tflops, bandwidth, source = DEVICES[args.device]
    times = {k: v for log in args.measured or [] for k, v in measured_times(log).items()}
    print(f"# backward floors on {args.device}: {tflops:g} TFLOPS mma.sync, {bandwidth:g} TB/s ({source}); "
          f"blocks {args.m_block}x{args.n_block}")
    for problem in _header(args.suite, "| problem | GFLOP | tile pairs | HBM MB | L2 loads MB | fp32 atomics M | tensor floor ms | "
                           "HBM floor ms |" + (" table ms (x floor) | upstream ms (x floor) |" if times else "")):
        f = floor(problem, args.m_block, args.n_block)
        row = (f"| {problem.name} | {f.flops / 1e9:.0f} | {f.pairs} | {f.hbm_bytes / 1e6:.0f} | {f.l2_load_bytes / 1e6:.0f} | "
               f"{f.atomics / 1e6:.1f} | {f.tensor_ms(tflops):.3f} | {f.hbm_ms(bandwidth):.3f} |")
        if times:
            lowest = max(f.tensor_ms(tflops), f.hbm_ms(bandwidth))
            table, upstream = times.get(problem.name, (float("nan"), float("nan")))
            row += f" {table:.3f} ({table / lowest:.2f}x) | {upstream:.3f} ({upstream / lowest:.2f}x) |"
        print(row)
    return 0


def shared_table(args) -> int:
    """--shared: per problem, the config (upstream's default or the table's), its shared-memory bytes per pair and
    per FLOP, and the shared-memory floor against the tensor floor on the device."""
    tflops = DEVICES[args.device][0]
    times = {k: v for log in args.measured or [] for k, v in measured_times(log).items()}
    table = None
    if args.table:
        from fa4tune.harness.candidates import load_experiment

        table = load_experiment(Path(__file__).resolve().parent.parent / "experiment.py")
    sms, ghz = SHARED[args.device]
    print(f"# backward shared-memory floors on {args.device}: {sms} SMs x {SHARED_BYTES_PER_CLOCK} B/clock at {ghz:g} GHz; "
          f"tensor floor at {tflops:g} TFLOPS; configs: {'the dispatch table' if table else 'upstream defaults'}")
    for problem in _header(args.suite, "| problem | config | shared KB per pair | B per kFLOP | shared floor ms | tensor floor ms |"
                           + (" log's ms (x shared floor) |" if times else "")):
        pc = problem.problem_class
        config = table.backward_config(pc) if table else upstream_backward(pc)
        per_pair = shared_reads(config, problem.head_dim, problem.head_dim_v)
        pair_flops = 2.5 * 4 * config.m_block_size * config.n_block_size * problem.head_dim  # as flops counts it
        f = floor(problem, config.m_block_size, config.n_block_size)
        floor_ms = shared_ms(problem, config, args.device)
        label = (f"{config.kernel} {config.m_block_size}x{config.n_block_size} t{config.num_threads} "
                 f"{config.AtomLayoutMSdP}/{config.AtomLayoutNdKV}/{config.AtomLayoutMdQ}")
        row = (f"| {problem.name} | {label} | {per_pair / 1024:.0f} | {per_pair / pair_flops * 1e3:.1f} | {floor_ms:.3f} | "
               f"{f.tensor_ms(tflops):.3f} |")
        if times:
            measured = times.get(problem.name, (float("nan"),) * 2)[0 if table else 1]
            row += f" {measured:.3f} ({measured / floor_ms:.2f}x) |"
        print(row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
