"""Which key blocks each SM gets at the GQA chunked prefill under each tile order, replayed on a CTA-to-SM map that
bench/gpu_sm_dispatch.py --dump recorded on a GPU (no GPU here: the CPU replays the orders).

    python3 bench/pairing_model.py [docs/measurements/data/2026-12-04-h200-cta-sm-2per.json]

The problem: sq 512 over sk 8K, 32 query / 8 KV heads, d128, causal (bottom-right), 64x96 tiles with GQA packing
(16 query positions x 4 heads per tile): 32 m blocks x 8 KV heads = 256 CTAs, two per SM. Per order, the busiest SM's
sum of key blocks (the makespan if an SM's two CTAs share it evenly) and the mean over SMs. The orders: upstream's
(block index), longest first (sm120_tma_lpt), odd rounds reversed (sm120_tma_paired), and the SM claims of
sm120_tma_smpaired, replayed with CTAs arriving in block-index order (the map's order). A model of whole-tile work,
not a timing: docs/measurements/2026-12-04-h200-smpaired-in-head.md holds what the GPU measured.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_MAP = ROOT / "docs" / "measurements" / "data" / "2026-12-04-h200-cta-sm-2per.json"
M_BLOCKS, KV_HEADS, QHEADS_PER_KV = 32, 8, 4
SEQLEN_Q, SEQLEN_K, TILE_M, TILE_N = 512, 8192, 64, 96


def key_blocks(m_block: int) -> int:
    """Key blocks of packed m block `m_block` (TILE_M rows = TILE_M / 4 query positions), causal bottom-right."""
    last_position = (m_block + 1) * TILE_M // QHEADS_PER_KV
    return math.ceil((SEQLEN_K - SEQLEN_Q + last_position) / TILE_N)


def orders(num_sms: int, smid: list[int]) -> dict[str, list[int]]:
    """Per order, the m block each CTA (by block index) runs."""
    from fa4tune.tile_counter import claim_ranks
    from kernels.tma_lpt_forward_sm120 import longest_first
    from kernels.tma_paired_forward_sm120 import paired_longest_first

    total = M_BLOCKS * KV_HEADS
    lpt = [longest_first(i, M_BLOCKS, KV_HEADS, 1)[0] for i in range(total)]
    ranks, _ = claim_ranks(smid[:total])
    return {
        "upstream (block index)": [i % M_BLOCKS for i in range(total)],
        "longest first (sm120_tma_lpt)": lpt,
        "odd rounds reversed (sm120_tma_paired)": [paired_longest_first(i, M_BLOCKS, KV_HEADS, 1, num_sms)[0] for i in range(total)],
        "claimed by SM (sm120_tma_smpaired)": [lpt[r] for r in ranks],
    }


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    data = json.loads(Path(argv[0] if argv else DEFAULT_MAP).read_text())
    smid, num_sms = data["smid"], data["sms"]
    total = M_BLOCKS * KV_HEADS
    print(f"{data['device']}: {num_sms} SMs, {total} CTAs of {key_blocks(0)}-{key_blocks(M_BLOCKS - 1)} key blocks; "
          f"fluid bound {sum(key_blocks(m) for m in range(M_BLOCKS)) * KV_HEADS / num_sms:.1f} key blocks per SM")
    print("| order | busiest SM (key blocks) | its tiles | mean over SMs with two CTAs |\n|---|---|---|---|")
    for name, m_blocks in orders(num_sms, smid).items():
        per_sm: dict[int, list[int]] = {}
        for cta in range(total):
            per_sm.setdefault(smid[cta], []).append(key_blocks(m_blocks[cta]))
        busiest = max(per_sm.values(), key=sum)
        pairs = [sum(v) for v in per_sm.values() if len(v) == 2]
        print(f"| {name} | {sum(busiest)} | {' + '.join(map(str, sorted(busiest, reverse=True)))} | {sum(pairs) / len(pairs):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
