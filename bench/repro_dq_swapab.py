"""Minimal reproduction, upstream's classes alone: the SM120 dQ postprocess mis-stores dQ when dQ_swapAB=True.

    python3 bench/repro_dq_swapab.py        # any SM90+ GPU with flash-attn-4 4.0.0b36; no fa4-tune code

`FlashAttentionBackwardPostprocess` converts the fp32 dQ accumulator (laid out by the main kernel's tiled MMA) to
bf16. For arch 8x it stores registers to shared memory with a plain copy; for arch 12x (SM120, which runs the same
SM80 mma.sync backward) `utils.get_smem_store_atom` returns an stmatrix atom with transpose=dQ_swapAB, and the
swapped path also writes through a transposed view of sdQ. The same accumulator converted with arch=80 and with
arch=120 must give the same dQ: it does without the swap and differs with it.
"""

import torch

import cutlass
from flash_attn.cute.interface import _bwd_postprocess_convert


def convert(accum, arch, swap, atom, head_dim, m_block, seqlen, heads):
    out = torch.empty(1, seqlen, heads, head_dim, dtype=torch.bfloat16, device="cuda")
    _bwd_postprocess_convert(accum, out, 1.0, None, None, arch, cutlass.BFloat16, head_dim, m_block, 128, atom, swap,
                             fake_mode=False)
    torch.cuda.synchronize()
    return out.float()


def main() -> None:
    torch.manual_seed(0)
    head_dim, m_block, seqlen, heads = 128, 64, 256, 2
    accum = torch.randn(1, heads, seqlen * head_dim, dtype=torch.float32, device="cuda")
    print("dQ_swapAB AtomLayoutMdQ  max|dQ(arch=120) - dQ(arch=80)|  (128 threads, m_block 64, head_dim 128)")
    for swap in (False, True):
        for atom in (1, 2, 4):
            a80 = convert(accum, 80, swap, atom, head_dim, m_block, seqlen, heads)
            a120 = convert(accum, 120, swap, atom, head_dim, m_block, seqlen, heads)
            print(f"{str(swap):9s} {atom:14d}  {(a120 - a80).abs().max().item():.4g}")


if __name__ == "__main__":
    main()
