"""The tile counter of the forward classes whose CTAs claim their tiles (`tile_counter = True`, e.g.
kernels/tma_smpaired_forward_sm120.py): int32 words in global memory, zero between launches.

Layout: words 0-1, the claim word (uint64: claims from the front of the tile list in the low half, from the back in
the high half); then SM_WORDS words, one per SM id (modulo SM_WORDS): the CTAs that have started on that SM. The
kernel's last claimer zeroes them all, so the counter is zero again when the launch ends and no memset runs between
launches. One counter per device and stream: two launches in flight on one counter would claim each other's tiles.
The kernels read it through the `mCuTotalSplitsMBlocks` slot of upstream's launch (kernels/tma_forward_sm120.py).
"""

from __future__ import annotations

CLAIM_WORDS = 2
SM_WORDS = 256  # SM ids of today's GPUs are below 200 (H200 132, RTX 5090 170); more only share words
WORDS = CLAIM_WORDS + SM_WORDS

_COUNTERS: dict[tuple, object] = {}


def claimed_rank(back, front_before, back_before, total):
    """The rank in the longest-first list that a claim runs: the front claim after `front_before` others runs rank
    front_before, the back claim after `back_before` others rank total - 1 - back_before (`back` is 0 or 1). Integer
    arithmetic only: the kernel calls it with Int32 values, the tests with ints."""
    return front_before + back * (total - 1 - back_before - front_before)


def claim_ranks(arrival_sms: list[int], total: int | None = None) -> tuple[list[int], list[int]]:
    """The kernel's protocol replayed on the CPU from a zero counter: CTAs of a grid of `total` tiles (default: one per
    arrival) start in the order of `arrival_sms` (each one's SM id); their ranks and the counter's words afterwards."""
    words, ranks = [0] * WORDS, []
    total = len(arrival_sms) if total is None else total
    for sm in arrival_sms:
        sm_word = CLAIM_WORDS + sm % SM_WORDS
        back = words[sm_word] % 2
        words[sm_word] += 1
        front_before, back_before = words[0], words[1]
        words[1 if back else 0] += 1
        ranks.append(claimed_rank(back, front_before, back_before, total))
        if front_before + back_before == total - 1:
            words = [0] * WORDS
    return ranks, words


def counter_for(like):
    """The zeroed counter for launches on `like`'s device and current stream (a fresh one for a fake tensor: the
    CPU's compiles only need its type)."""
    import torch

    if not like.is_cuda or type(like) is not torch.Tensor:
        return like.new_zeros(WORDS, dtype=torch.int32)
    key = (like.device.index, torch.cuda.current_stream(like.device).cuda_stream)
    counter = _COUNTERS.get(key)
    if counter is None:
        counter = _COUNTERS[key] = torch.zeros(WORDS, dtype=torch.int32, device=like.device)
    return counter
