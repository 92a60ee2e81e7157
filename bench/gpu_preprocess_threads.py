"""The backward preprocess's thread count on a GPU: its kernel's time per value, per problem.

    FLASH_ATTENTION_ARCH=sm_120 FLASH_ATTENTION_NUM_SMS=132 python3 bench/gpu_preprocess_threads.py \
        [--suite standard] [--only TEXT] [--calls 20] [--out FILE.json]

For each backward problem of the suite, with the dispatch table's backward config: every thread count of
fa4tune.feasibility.PREPROCESS_THREADS that the kernel can run (check_preprocess_threads). Each value first
computes dQ, dK and dV and is compared with upstream's 256 threads (the preprocess only reorders a row sum:
max |difference| <= 1e-2 x max |dQ, dK, dV|, else the value is `incorrect`). Its backward calls then run under
torch.profiler (bench/gpu_call_profile.profile: warm-up, then `--calls` calls with a synchronize between them).
Prints, per problem and value: the preprocess kernel's mean time and 256's time over it (the backward's span is
not used: its host path has gaps over gpu_call_profile's 200 µs call split, so spans are not comparable).
The preprocess does not touch the main kernel's knobs, so the count is chosen per class apart from the search.
"""

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="standard")
    parser.add_argument("--only", default="")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)

    import torch

    import experiment
    from fa4tune.feasibility import PREPROCESS_THREADS, check_preprocess_threads
    from fa4tune.sm120_interface import build
    from fa4tune.suites import load_suite
    from gpu_call_profile import profile

    host = build(experiment.kernel_class)
    rows = []
    print(f"device: {torch.cuda.get_device_name()} (SM120 kernels emulated unless it is an SM120 GPU)")
    print(f"{'problem':34s} {'class':26s} {'threads':>7s} {'status':9s} {'preprocess us':>13s} {'vs 256':>7s}")
    for problem in load_suite(args.suite):
        if not problem.backward or args.only not in problem.label:
            continue
        pc = problem.problem_class
        fwd, bwd = experiment.forward_config(pc), experiment.backward_config(pc)
        gen = torch.Generator(device="cuda").manual_seed(0)
        shape = lambda s, h, d: (problem.batch, s, h, d)  # noqa: E731
        q = torch.randn(shape(problem.seqlen_q, problem.num_heads, problem.head_dim), device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(shape(problem.seqlen_k, problem.num_heads_kv, problem.head_dim), device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn(shape(problem.seqlen_k, problem.num_heads_kv, problem.head_dim_v), device="cuda", dtype=torch.bfloat16, generator=gen)
        scale = problem.head_dim ** -0.5
        with torch.no_grad():
            out, lse, *_ = host.flash_attn_fwd(q, k, v, softmax_scale=scale, causal=problem.causal,
                                               tile_mn=(fwd.tile_m, fwd.tile_n), return_lse=True, sm120_config=fwd)
        dout = torch.randn_like(out)

        def backward(threads):
            return host.flash_attn_bwd(q, k, v, out, dout, lse, softmax_scale=scale, causal=problem.causal, sm120_config=bwd,
                                       sm120_preprocess_threads=threads)

        reference = [g.float() for g in backward(256)]
        base = None
        for threads in PREPROCESS_THREADS:
            if not check_preprocess_threads(threads, bwd, pc):
                continue
            grads = [g.float() for g in backward(threads)]
            worst = max(float((g - r).abs().max() / r.abs().max().clamp_min(1e-6)) for g, r in zip(grads, reference))
            status = "ok" if worst <= 1e-2 else "incorrect"
            kernels = profile(lambda: backward(threads), args.calls)[0] if status == "ok" else {}
            pre = sum(us for name, us in kernels.items() if "Preprocess" in name)
            if threads == 256:
                base = pre
            rows.append({"problem": problem.label, "class": pc.name, "threads": threads, "status": status, "max_rel_diff": worst,
                         "preprocess_us": pre, "kernels_us": kernels})
        for row in (r for r in rows if r["problem"] == problem.label):
            row["vs_256"] = base / row["preprocess_us"] if base and row["status"] == "ok" else None
            ratio = f"{row['vs_256']:.3f}" if row["vs_256"] else "-"
            print(f"{row['problem'][:34]:34s} {row['class'][:26]:26s} {row['threads']:7d} {row['status']:9s} "
                  f"{row['preprocess_us']:13.1f} {ratio:>7s}", flush=True)
        if args.out:  # after every problem: a run cut short keeps what it measured
            Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
