"""Which SM does each CTA of a one-wave grid land on? The assumption kernels/tma_paired_forward_sm120.py makes.

    python3 bench/gpu_sm_dispatch.py [--per-sm 2] [--rounds 2] [--dump cta_sm.json]

A Triton kernel of `rounds x SMs` programs, each of 64 / per-sm warps so that `per-sm` of them fill an SM's 2,048
threads (32 warps for 2), records its %smid and %nsmid and spins ~50 µs, so that the whole grid is resident together. Prints
%nsmid, the SM count torch reports, and how often CTA L and CTA L + S (S = SMs) ran on the same SM: the pairing the
paired class counts on. Nothing else is timed; no SM120 kernel runs (the same on any GPU).
"""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-sm", type=int, default=2, choices=(2, 4), help="CTAs an SM holds at once")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dump", metavar="JSON", help="write every CTA's SM (a list indexed by CTA) to this file")
    args = parser.parse_args(argv)

    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def record(smid_ptr, nsmid_ptr, spin_ns):
        pid = tl.program_id(0)
        dummy = tl.load(smid_ptr + pid)
        smid = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [dummy], dtype=tl.int32, is_pure=False, pack=1)
        nsmid = tl.inline_asm_elementwise("mov.u32 $0, %nsmid;", "=r,r", [dummy], dtype=tl.int32, is_pure=False, pack=1)
        start = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [dummy], dtype=tl.int64, is_pure=False, pack=1)
        now = start
        while now - start < spin_ns:
            now = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [dummy], dtype=tl.int64, is_pure=False, pack=1)
        tl.store(smid_ptr + pid, smid)
        tl.store(nsmid_ptr + pid, nsmid)

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    grid = sms * args.rounds
    smid = torch.zeros(grid, dtype=torch.int32, device="cuda")
    nsmid = torch.zeros(grid, dtype=torch.int32, device="cuda")
    warps = 64 // args.per_sm  # 2,048 threads per SM: 32 warps -> 2 CTAs at once, 16 -> 4
    record[(grid,)](smid, nsmid, 50_000, num_warps=warps)
    torch.cuda.synchronize()
    ids, n = smid.tolist(), set(nsmid.tolist())
    print(f"{torch.cuda.get_device_name(0)}: torch SMs {sms}; %nsmid {sorted(n)}; {grid} CTAs of {warps} warps "
          f"({args.per_sm} per SM); distinct SMs used {len(set(ids))}")
    for r in range(1, args.rounds):
        same = sum(ids[p] == ids[r * sms + p] for p in range(sms))
        print(f"round {r}: CTA L + {r}*S on CTA L's SM for {same} of {sms} L")
    print("first 16 CTAs' SMs:", ids[:16])
    print(f"CTAs {sms}..{sms + 15}' SMs:", ids[sms:sms + 16])
    if args.dump:
        import json

        with open(args.dump, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "sms": sms, "per_sm": args.per_sm, "smid": ids}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
