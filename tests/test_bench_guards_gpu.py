"""bench/guards_gpu.py's honest kernel computes attention (here on the CPU, against torch SDPA), causal aligned
bottom-right and GQA, so that on a GPU only the cheat can fail the guards."""

import torch
import torch.nn.functional as F

from bench import guards_gpu
from fa4tune.config import Problem
from fa4tune.harness.settings import Settings


def test_the_honest_kernel_is_attention():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, s, h, 32, generator=gen) for s, h in ((3, 4), (5, 2), (5, 2)))
    for causal in (False, True):
        out, lse = guards_gpu.einsum_attention(q, k, v, causal)
        mask = torch.ones(3, 5, dtype=torch.bool).tril(2) if causal else None
        ref = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)), attn_mask=mask, enable_gqa=True).transpose(1, 2)
        assert torch.allclose(out, ref, atol=1e-5) and lse.shape == (1, 4, 3)


def test_the_planted_cheats_the_gpu_run_plants_are_each_caught_here_on_the_cpu():
    # issue 41: the same cheats, the same measure_step; the GPU run (bench/guards_gpu.py) confirms them on CUDA
    torch.set_num_threads(1)
    problem = Problem(1, 48, 48, 2, 2, 32, 32, True, name="tiny causal")
    rows = guards_gpu.planted_cheats(guards_gpu.einsum_attention, problem, "cpu", Settings(gate_seed=3, warmup=1, rounds=3, input_sets=2, gate_random_problems=1))
    assert [name for name, *_ in rows] == [name for name, *_ in guards_gpu.CHEATS]
    assert [row for row in rows if not row[-1]] == []
