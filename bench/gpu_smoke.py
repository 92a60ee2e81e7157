"""GPU smoke check of the patched SM120 host path: correctness and rough speed of a few configs.

    FLASH_ATTENTION_ARCH=sm_120 FLASH_ATTENTION_NUM_SMS=<SMs> python3 bench/gpu_smoke.py

Not the harness (prepare.py is): a quick check that every knob runs on the GPU and gives correct results.
"""

import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import triton.testing  # noqa: E402

from fa4tune.harness.candidates import load_experiment  # noqa: E402
from fa4tune.harness.settings import EXPERIMENT_PATH as _EXPERIMENT  # noqa: E402
from fa4tune.config import BackwardConfig, ForwardConfig  # noqa: E402

experiment = load_experiment(_EXPERIMENT)  # the static rules and the pin first (guards.admit), as every measuring path


def reference(q, k, v, causal):
    qf, kf, vf = q.float(), k.float(), v.float()
    rep = q.shape[2] // k.shape[2]
    kf, vf = kf.repeat_interleave(rep, 2), vf.repeat_interleave(rep, 2)
    s = torch.einsum("bqhd,bkhd->bhqk", qf, kf) / math.sqrt(q.shape[-1])
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(sk - sq)
        s = s.masked_fill(~mask, float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), vf)


def main():
    torch.manual_seed(0)
    print(f"device: {torch.cuda.get_device_name()} (SM120 kernels emulated unless this is an SM120 GPU)")
    shapes = [(1, 2048, 16, 16, 128, True), (1, 2048, 16, 16, 128, False), (2, 1024, 32, 8, 128, True), (2, 1000, 16, 16, 64, True)]
    fwd_configs = [
        ForwardConfig(128, 64, 128, 1, False), ForwardConfig(128, 64, 256, 1, False), ForwardConfig(128, 64, 128, 2, False),
        ForwardConfig(128, 64, 128, 1, True), ForwardConfig(128, 64, 128, 2, True), ForwardConfig(192, 32, 128, 1, False),
        ForwardConfig(256, 64, 256, 1, False), ForwardConfig(128, 96, 256, 1, False),
    ]
    bwd_configs = [BackwardConfig(), BackwardConfig(m_block_size=128, n_block_size=64, num_threads=256),
                   BackwardConfig(m_block_size=64, n_block_size=128, num_threads=256, AtomLayoutMSdP=2, AtomLayoutNdKV=4, AtomLayoutMdQ=2)]
    print(f"{'shape':34s} {'dir':4s} {'config':60s} {'max err':>9s} {'tol':>9s} {'ok':>3s} {'ms':>8s}")
    for b, s, h, hkv, d, causal in shapes:
        q = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16)
        ref = reference(q, k, v, causal)
        low = reference(q.bfloat16(), k, v, causal).bfloat16().float()
        tol = 2 * (low - ref).abs().max().item() + 1e-3
        label = f"b{b} s{s} h{h}/{hkv} d{d} {'causal' if causal else 'nc'}"
        for cfg in fwd_configs:
            if d == 64 and cfg.tile_n == 96:
                continue
            try:
                t0 = time.time()
                out = experiment.attention(q, k, v, causal=causal, fwd_config=cfg)
                err = (out.float() - ref).abs().max().item()
                ms = triton.testing.do_bench(lambda: experiment.attention(q, k, v, causal=causal, fwd_config=cfg), warmup=5, rep=20)
                print(f"{label:34s} fwd  {cfg.short():60s} {err:9.2e} {tol:9.2e} {'yes' if err <= tol else 'NO':>3s} {ms:8.3f}", flush=True)
            except Exception as e:  # keep going: this is a smoke check
                print(f"{label:34s} fwd  {cfg.short():60s} ERROR {type(e).__name__}: {str(e)[:200]}", flush=True)
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        dout = torch.randn_like(q)
        refg = torch.autograd.grad(reference(qg, kg, vg, causal), (qg, kg, vg), dout.float())
        for cfg in bwd_configs:
            try:
                out = experiment.attention(qg, kg, vg, causal=causal, bwd_config=cfg)
                grads = torch.autograd.grad(out, (qg, kg, vg), dout)
                err = max((g.float() - r).abs().max().item() / (r.abs().max().item() + 1e-6) for g, r in zip(grads, refg))
                print(f"{label:34s} bwd  {cfg.short()[:60]:60s} {err:9.2e} {'(rel)':>9s} {'yes' if err < 2e-2 else 'NO':>3s}", flush=True)
            except Exception as e:
                print(f"{label:34s} bwd  {cfg.short()[:60]:60s} ERROR {type(e).__name__}: {str(e)[:200]}", flush=True)


if __name__ == "__main__":
    main()
