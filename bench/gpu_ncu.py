"""One problem's forward (or backward) calls, for Nsight Compute to read the kernel's counters (what bounds it: the
tensor pipes, the L2, the warps' stalls). The script only runs the calls; ncu, around it, profiles them:

    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
    FLASH_ATTENTION_ARCH=sm_120 FLASH_ATTENTION_NUM_SMS=132 $NCU --clock-control none -k regex:ForwardSm120 \
        --launch-skip 2 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
        python3 bench/gpu_ncu.py --suite chunked --only "512 over 8k" --config dispatch
    # the backward (issue 44): -k regex:BackwardSm120, then
    #   python3 bench/gpu_ncu.py --suite standard --only "b1 s8192 h16 d128 causal" --direction bwd --config upstream

--config: "dispatch" (the dispatch table's config for the problem's class), "upstream" (upstream's SM120 defaults), or
a config in either of bench/common.py's notations (split or tma); the backward takes "dispatch" or "upstream". Each call is checked against torch SDPA before the calls ncu reads (a
kernel that computes the wrong thing is not worth a profile). --launch-skip 2 skips the checked call and one warm
call. On a GPU that is not SM 12.0 the SM120 kernels run emulated (label the figures). ncu reads counters only where
the runtime allows it (docs: the device tool's KINDS.md).
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import config_name, resolve_config  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="chunked")
    parser.add_argument("--only", default="512 over 8k", help="the first problem whose label contains this")
    parser.add_argument("--config", default="dispatch", help="dispatch, upstream, or a config in bench/common.py's notations")
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--direction", choices=("fwd", "bwd"), default="fwd", help="fwd, or bwd: forward and backward per call")
    args = parser.parse_args(argv)
    if args.direction == "bwd" and args.config not in ("dispatch", "upstream"):
        parser.error(f"--config for the backward is dispatch or upstream, got {args.config!r}")

    import torch
    import torch.nn.functional as F

    from fa4tune.harness.candidates import load_experiment
    from fa4tune.harness.gate import TORCH_DTYPES
    from fa4tune.harness.settings import EXPERIMENT_PATH as _EXPERIMENT

    experiment = load_experiment(_EXPERIMENT)  # the static rules and the pin first (guards.admit), as every measuring path
    from fa4tune.suites import load_suite

    problem = next(p for p in load_suite(args.suite) if args.only in p.label)
    gen = torch.Generator(device="cuda").manual_seed(0)
    dtype = TORCH_DTYPES[problem.dtype]
    q, k, v = (torch.randn(problem.batch, s, h, d, device="cuda", dtype=dtype, generator=gen) for s, h, d in (
        (problem.seqlen_q, problem.num_heads, problem.head_dim), (problem.seqlen_k, problem.num_heads_kv, problem.head_dim),
        (problem.seqlen_k, problem.num_heads_kv, problem.head_dim_v)))
    mask = _bottom_right(problem) if problem.causal else None
    if args.direction == "bwd":
        return _backward(experiment, problem, args, q, k, v, mask)
    cfg = resolve_config(args.config, problem.problem_class, experiment)
    out = experiment.attention(q, k, v, causal=problem.causal, fwd_config=cfg)
    ref = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)), is_causal=False, enable_gqa=True,
                                         attn_mask=mask).transpose(1, 2)
    error = (out.float() - ref.float()).abs().max().item()
    if error > 2e-2:
        print(f"{problem.label} {config_name(cfg)}: max error {error:.3g} against SDPA: not profiled")
        return 1
    for _ in range(args.calls):
        experiment.attention(q, k, v, causal=problem.causal, fwd_config=cfg)
    torch.cuda.synchronize()
    print(f"{problem.label} {config_name(cfg)}: max error {error:.3g} against SDPA; {args.calls} more calls")
    return 0


def _backward(experiment, problem, args, q, k, v, mask) -> int:
    """Forward and backward per call, with the dispatch table's or upstream's backward config; dQ, dK, dV checked
    against SDPA's first (the relative max error, as bf16 gradients differ in scale)."""
    import torch
    import torch.nn.functional as F

    from fa4tune.defaults import upstream_backward

    pc = problem.problem_class
    cfg = experiment.backward_config(pc) if args.config == "dispatch" else upstream_backward(pc)
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    out = experiment.attention(q, k, v, causal=problem.causal, bwd_config=cfg)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)), is_causal=False, enable_gqa=True,
                                         attn_mask=mask).transpose(1, 2)
    refs = torch.autograd.grad(ref, (q, k, v), dout)
    error = max(((g.float() - r.float()).abs().max() / r.float().abs().max()).item() for g, r in zip(grads, refs))
    if error > 2e-2:
        print(f"{problem.label} bwd {cfg.short()}: relative max error {error:.3g} against SDPA: not profiled")
        return 1
    for _ in range(args.calls):
        torch.autograd.grad(experiment.attention(q, k, v, causal=problem.causal, bwd_config=cfg), (q, k, v), dout)
    if q.is_cuda:
        torch.cuda.synchronize()
    print(f"{problem.label} bwd {cfg.short()}: relative max error {error:.3g} against SDPA; {args.calls} more calls")
    return 0

def _bottom_right(problem, device="cuda"):
    """The causal mask aligned bottom-right (query i sees keys up to i + seqlen_k - seqlen_q), as upstream's."""
    import torch

    rows = torch.arange(problem.seqlen_q, device=device)[:, None] + problem.seqlen_k - problem.seqlen_q
    return torch.arange(problem.seqlen_k, device=device)[None, :] <= rows


if __name__ == "__main__":
    sys.exit(main())
