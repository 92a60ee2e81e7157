"""Where one attention call's time goes on a GPU: each kernel's duration, the gaps between them, and the call's span.

    FLASH_ATTENTION_ARCH=sm_120 FLASH_ATTENTION_NUM_SMS=132 python3 bench/gpu_call_profile.py \
        [--suite decode] [--only "b1 4k"] [--configs 32x64x64x2:0,...] [--calls 20] [--cold] [--combine-launch pdl|stream]

For each problem and config (either of bench/common.py's notations; "dispatch" for the dispatch table's config,
"upstream" for upstream's SM120 defaults, "sdpa" for
torch SDPA; "dispatch-bwd" for the dispatch table's forward and backward, one forward and one backward per call,
with the share of each kernel: the backward's preprocess, main kernel and postprocesses): warm-up calls (the compile), then `--calls` calls under torch.profiler, one at a time with a
synchronize between them. Prints, per call on average: each kernel's GPU time, the GPU-idle gaps between the
first kernel's start and the last kernel's end, and the host time of the call. A short call whose span is far
above its kernels' sum is bound by the host path between launches, not by the kernels.

--cold profiles each call as the harness times it: the L2 flushed, then a blocking kernel, then the call, so its
launches are queued and its kernels read from HBM; the flush and the blocking kernel are left out of the figures.
"""

import argparse
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import config_name, resolve_config  # noqa: E402

CALL_GAP_US = 200  # a gap between kernels longer than this (µs) is the host's synchronize and next call


def call_of(problem, spec: str, experiment):
    """(label, fn) running one forward of `problem` with config `spec`."""
    import torch
    import torch.nn.functional as F

    from fa4tune.harness.gate import TORCH_DTYPES

    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(problem.batch, s, h, d, device="cuda", dtype=TORCH_DTYPES[problem.dtype], generator=gen)
               for s, h, d in ((problem.seqlen_q, problem.num_heads, problem.head_dim),
                               (problem.seqlen_k, problem.num_heads_kv, problem.head_dim),
                               (problem.seqlen_k, problem.num_heads_kv, problem.head_dim_v)))
    if spec == "dispatch-bwd":
        pc = problem.problem_class
        fwd, bwd = experiment.forward_config(pc), experiment.backward_config(pc)
        for t in (q, k, v):
            t.requires_grad_(True)
        dout = torch.randn_like(q)

        def step():
            out, _ = experiment.attention(q, k, v, causal=problem.causal, fwd_config=fwd, bwd_config=bwd, return_lse=True)
            out.backward(dout)

        return f"{config_name(fwd)} + backward {bwd.m_block_size}x{bwd.n_block_size} t{bwd.num_threads}", step
    if spec == "sdpa":
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        return "torch sdpa", lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=problem.causal, enable_gqa=True)
    cfg = resolve_config(spec, problem.problem_class, experiment)
    return config_name(cfg), lambda: experiment.attention(q, k, v, causal=problem.causal, fwd_config=cfg)


def _gpu_events(prof):
    import torch

    return sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time_total > 0),
                  key=lambda e: e.time_range.start)


def profile(fn, calls: int, before=None) -> tuple[dict, float, float]:
    """({kernel name: mean µs per call}, mean span µs, mean host µs per call) over `calls` profiled calls;
    `before()` (the cold setup) runs ahead of each call, and its kernels are left out."""
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile as torch_profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    setup_names: set = set()
    if before is not None:
        with torch_profile(activities=[ProfilerActivity.CUDA]) as setup:
            before()
            torch.cuda.synchronize()
        setup_names = {e.name for e in _gpu_events(setup)}
    host = 0.0
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            if before is not None:
                before()
            start = time.perf_counter()
            fn()
            host += time.perf_counter() - start
            torch.cuda.synchronize()
    kernels = [e for e in _gpu_events(prof) if e.name not in setup_names]
    per_kernel: dict = defaultdict(float)
    for e in kernels:
        per_kernel[e.name[:90]] += e.device_time_total / calls
    spans = call_spans([(e.time_range.start, e.time_range.end) for e in kernels])
    return dict(per_kernel), sum(spans) / max(1, len(spans)), host / calls * 1e6


def call_spans(intervals, gap_us: float = CALL_GAP_US) -> list[float]:
    """The span (first start to last end, µs) of each call, from its kernels' (start, end) in time order: calls are
    separated by a synchronize, so a gap longer than `gap_us` (longer than any within a call) splits them."""
    spans, group = [], []
    for start, end in intervals:
        if group and start - group[-1][1] > gap_us:
            spans.append(group[-1][1] - group[0][0])
            group = []
        group.append((start, end))
    if group:
        spans.append(group[-1][1] - group[0][0])
    return spans


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="decode")
    parser.add_argument("--only", default="")
    parser.add_argument("--configs", default="32x64x64x2:0,dispatch,sdpa")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--cold", action="store_true", help="each call behind an L2 flush and a blocking kernel, as the harness times it")
    parser.add_argument("--block-ms", type=float, default=2.0,
                        help="the blocking kernel's length with --cold: longer than the call's host path under the profiler")
    parser.add_argument("--combine-launch", choices=("pdl", "stream"), default="pdl",
                        help="the split-KV combine as a programmatic dependent launch (the default) or plainly stream-ordered")
    args = parser.parse_args(argv)

    from fa4tune import sm120_interface
    from fa4tune.suites import load_suite

    from fa4tune.harness.candidates import load_experiment
    from fa4tune.harness.settings import EXPERIMENT_PATH as _EXPERIMENT

    experiment = load_experiment(_EXPERIMENT)  # the static rules and the pin first (guards.admit), as every measuring path

    sm120_interface.COMBINE_PDL = args.combine_launch == "pdl"
    before = None
    if args.cold:
        import torch

        from fa4tune.harness.steps import make_flusher
        from fa4tune.harness.timing import TorchCudaDevice

        flush, device = make_flusher(torch.device("cuda")), TorchCudaDevice()

        def before():
            flush()
            device.block(args.block_ms)  # longer than the call's host path, so its launches queue behind it

    for problem in [p for p in load_suite(args.suite) if args.only in p.label]:
        for spec in args.configs.split(","):
            if spec == "dispatch-bwd" and not problem.backward:
                continue
            label, fn = call_of(problem, spec, experiment)
            kernels, span, host = profile(fn, args.calls, before)
            busy = sum(kernels.values())
            print(f"\n{problem.label} | {label}{' | cold' if args.cold else ''} | combine {args.combine_launch}: span {span:.1f} µs, kernels {busy:.1f} µs, idle inside the span "
                  f"{max(0.0, span - busy):.1f} µs, host {host:.1f} µs per call", flush=True)
            for name, us in sorted(kernels.items(), key=lambda kv: -kv[1]):
                print(f"    {us:8.1f} µs  {100 * us / busy:5.1f} %  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
