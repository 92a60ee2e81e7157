"""bench/gpu_ncu.py: the SDPA reference's causal mask is aligned bottom-right, as upstream's kernels align it."""

from types import SimpleNamespace

from bench import gpu_ncu


def test_the_reference_mask_is_bottom_right():
    mask = gpu_ncu._bottom_right(SimpleNamespace(seqlen_q=2, seqlen_k=4), device="cpu")
    assert mask.tolist() == [[True, True, True, False], [True, True, True, True]]
