"""How fast can any kernel do a decode on this GPU, timed as the harness times it? Floors beside the table's kernel.

    FLASH_ATTENTION_ARCH=sm_120 FLASH_ATTENTION_NUM_SMS=132 python3 bench/gpu_decode_floor.py [--suite decode] [--only "b1 4k"]

Every candidate runs under the harness's own timer (fa4tune.harness.timing: the L2 flushed before each call,
every round behind a blocking kernel, CUDA events around each call, the harness's warm-up and rounds), all of
them interleaved in one benchmark per problem:

- `events only`: nothing between the two events: what the timer reads for no work at all;
- `one tiny kernel`: one launch that adds 1 to one element: a launch's floor;
- `read K+V (BxI)`: one Triton kernel that reads all of K and V once (each program B x I elements of each, fp32
  sums, one float out per program), for a few shapes of the grid: the cold-read floor of the problem's bytes;
- `read K+V + tiny kernel`: the same, then a second launch: the floor of a two-kernel decode;
- `read K+V + merge in last CTA` (--merge-splits): one kernel, `splits` programs per KV head, each writing an fp32
  partial and counting itself on an acq_rel atomic; the last of a head sums the partials: the floor of a one-kernel
  decode whose splits merge through global memory (checked against torch's sum once, before it is timed);
- `attention no merge (SxNxW)` (--attention): a split attention whose programs (S per KV head, W warps) load their
  keys' K and V straight into registers, N keys per load, and write unmerged fp32 partials: what a split kernel that
  keeps its bytes in flight in registers (not in SM120's 99 KB of shared memory) could take; checked against SDPA
  once (the partials merged by torch); with --merge-attention also `+ merge kernel` and `+ PDL merge kernel`: the
  same and a minimal merge kernel (each program loads its row's partials at once), after it or as its
  programmatic dependent: a two-kernel decode's floor with real attention in it;
- `cluster-8 CUDA` (--cluster-cuda): bench/decode_cluster_cuda.py's one-kernel decode, a cluster of 8 CTAs per
  KV head merging on chip, CUDA-core (fma) or MMA (mma) math; its `_floor` variants: the same loads and merge, no
  attention math (`_floor_local`: without the cluster merge); `read_TxL`: plain reads on the cluster's grid, with
  and without the merge; the attention variants checked against torch before they are timed;
- `sm120_decode_cluster` (--decode-cluster): the CuTe class of the same design (kernels/decode_cluster_forward_sm120.py),
  through the harness's host path, checked against SDPA (output) once before it is timed;
- the dispatch table's config (experiment.attention), upstream's SM120 default config, and torch SDPA.

Prints, per problem, each candidate's median milliseconds and its ratio to upstream's; `10x upstream` is the
time a 10x target asks for. No correctness gate: the floors compute nothing the gate could check; the
attention candidates are gated in bench/gpu_splitkv.py and bench/table_vs_upstream.py.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from fa4tune.suites import load_suite  # noqa: E402

GRIDS = ((4096, 1, 8), (2048, 4, 8), (1024, 8, 8))  # (elements per load, loads per program, warps) of the read kernel


@functools.cache
def read_kernel():
    """The Triton kernel that reads K and V once: each program sums its own slice of both (defined once)."""
    import triton
    import triton.language as tl

    @triton.jit
    def read_kv(k_ptr, v_ptr, out_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
        pid = tl.program_id(0)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        base = pid * BLOCK * ITERS
        for i in tl.static_range(ITERS):
            offs = base + i * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            acc += tl.load(k_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            acc += tl.load(v_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + pid, tl.sum(acc, axis=0))

    return read_kv


@functools.cache
def read_merge_kernel():
    """A one-kernel decode's floor with its merge: each program sums its keys' K and V rows of one KV head (a split),
    writes that fp32 partial, then a CTA barrier and an acq_rel atomic on the head's counter; the program that counts
    last reads every split's partial, writes their sum and resets the counter (the merge a fused split-KV decode needs,
    through global memory, without the attention math)."""
    import triton
    import triton.language as tl

    @triton.jit
    def read_merge_kv(k_ptr, v_ptr, part_ptr, count_ptr, out_ptr, seqlen, H: tl.constexpr, D: tl.constexpr,
                      SPLITS: tl.constexpr, BLOCK_N: tl.constexpr, ITERS: tl.constexpr, MERGE: tl.constexpr):
        split = tl.program_id(0)
        hb = tl.program_id(1)  # batch * H + KV head
        b = hb // H
        h = hb % H
        d = tl.arange(0, D)
        acc = tl.zeros([D], dtype=tl.float32)
        for i in tl.static_range(ITERS):
            keys = split * BLOCK_N * ITERS + i * BLOCK_N + tl.arange(0, BLOCK_N)
            mask = keys < seqlen
            offs = ((b * seqlen + keys)[:, None] * H + h) * D + d[None, :]
            acc += tl.sum(tl.load(k_ptr + offs, mask=mask[:, None], other=0.0).to(tl.float32), axis=0)
            acc += tl.sum(tl.load(v_ptr + offs, mask=mask[:, None], other=0.0).to(tl.float32), axis=0)
        tl.store(part_ptr + (hb * SPLITS + split) * D + d, acc)
        if MERGE:  # without it: the same reads and partial writes, so the merge's cost is the difference
            tl.debug_barrier()  # every thread's part of the partial is written before the release
            done = tl.atomic_add(count_ptr + hb, 1, sem="acq_rel", scope="gpu")
            if done == SPLITS - 1:
                s = tl.arange(0, SPLITS)
                parts = tl.load(part_ptr + (hb * SPLITS + s)[:, None] * D + d[None, :], cache_modifier=".cg")
                tl.store(out_ptr + hb * D + d, tl.sum(parts, axis=0))
                tl.atomic_xchg(count_ptr + hb, 0)

    return read_merge_kv


@functools.cache
def split_attention_kernel():
    """A one-kernel decode's attention without its merge: each program is one split of one KV head, its keys' K and
    V loaded straight into registers (no shared-memory staging: what a kernel under SM120's 99 KB rule would have to
    do to keep more bytes in flight), the head's G query rows padded to 16 for tl.dot, an online softmax, and the
    split's unnormalized fp32 O rows with their row max and sum written out (merged by torch outside the timing, to
    check the kernel once)."""
    import triton
    import triton.language as tl

    @triton.jit
    def split_attention(q_ptr, k_ptr, v_ptr, o_ptr, ml_ptr, seqlen, scale_log2, H: tl.constexpr, G: tl.constexpr,
                        D: tl.constexpr, SPLITS: tl.constexpr, BLOCK_N: tl.constexpr, ITERS: tl.constexpr,
                        PDL: tl.constexpr = False):
        if PDL:  # the merge kernel (a programmatic dependent launch) may be scheduled now
            tl.extra.cuda.gdc_launch_dependents()
        split = tl.program_id(0)
        hb = tl.program_id(1)  # batch * H + KV head
        b = hb // H
        h = hb % H
        d = tl.arange(0, D)
        rows = tl.arange(0, 16)  # the head's G query heads (one query token), padded to tl.dot's 16 rows
        q = tl.load(q_ptr + (b * H * G + h * G + rows)[:, None] * D + d[None, :], mask=(rows < G)[:, None], other=0.0)
        m = tl.full([16], float("-inf"), dtype=tl.float32)
        l = tl.zeros([16], dtype=tl.float32)
        acc = tl.zeros([16, D], dtype=tl.float32)
        for i in tl.static_range(ITERS):
            keys = split * BLOCK_N * ITERS + i * BLOCK_N + tl.arange(0, BLOCK_N)
            mask = keys < seqlen
            offs = ((b * seqlen + keys)[:, None] * H + h) * D + d[None, :]
            k = tl.load(k_ptr + offs, mask=mask[:, None], other=0.0)
            v = tl.load(v_ptr + offs, mask=mask[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k)) * scale_log2
            s = tl.where(mask[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet: nothing to rescale
            alpha = tl.math.exp2(m - m_safe)
            p = tl.math.exp2(s - m_safe[:, None])
            l = l * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m = m_new
        part = hb * SPLITS + split
        tl.store(o_ptr + (part * 16 + rows)[:, None] * D + d[None, :], acc)
        tl.store(ml_ptr + (part * 16 + rows) * 2, m)
        tl.store(ml_ptr + (part * 16 + rows) * 2 + 1, l)

    return split_attention


@functools.cache
def merge_partials_kernel():
    """The merge of split_attention's partials: one program per (batch, KV head, query head of its group), which
    loads every split's row max, row sum and O row at once (one L2 round trip), weighs them and writes the bf16 O row.
    With PDL it is launched as a programmatic dependent launch and waits in griddepcontrol.wait for the partials."""
    import triton
    import triton.language as tl

    @triton.jit
    def merge_partials(o_ptr, ml_ptr, out_ptr, H: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
                       SPLITS: tl.constexpr, PDL: tl.constexpr):
        hb = tl.program_id(0)
        row = tl.program_id(1)
        if PDL:
            tl.extra.cuda.gdc_wait()
        split = tl.arange(0, SPLITS)
        d = tl.arange(0, D)
        part = (hb * SPLITS + split) * 16 + row
        m = tl.load(ml_ptr + part * 2)
        l = tl.load(ml_ptr + part * 2 + 1)
        o = tl.load(o_ptr + part[:, None] * D + d[None, :])
        m_all = tl.max(m, axis=0)
        w = tl.where(l > 0, tl.math.exp2(m - m_all), 0.0)
        out = tl.sum(o * w[:, None], axis=0) / tl.sum(l * w, axis=0)
        tl.store(out_ptr + (hb * G + row) * D + d, out.to(out_ptr.dtype.element_ty))

    return merge_partials


def split_attention_calls(q, k, v, splits: int, block_n: int, warps: int, merge: str = ""):
    """The split attention above (split_attention_kernel) with `splits` programs per KV head; checked once against
    torch SDPA (the partials merged by torch) before it is timed. merge: '' (none), 'stream' (merge_partials_kernel
    launched after it) or 'pdl' (launched as its programmatic dependent); the merged output is checked too."""
    import math

    import torch
    import torch.nn.functional as F
    import triton

    batch, seqlen, heads, dim = k.shape
    group = q.shape[2] // heads
    assert q.shape[1] == 1 and group <= 16, "the prototype runs one query token and at most 16 query heads per KV head"
    iters = triton.cdiv(triton.cdiv(seqlen, splits), block_n)
    o = torch.empty(batch * heads * splits, 16, dim, device=k.device, dtype=torch.float32)
    ml = torch.empty(batch * heads * splits, 16, 2, device=k.device, dtype=torch.float32)
    kernel = split_attention_kernel()
    scale_log2 = dim ** -0.5 * math.log2(math.e)
    pdl = merge == "pdl"
    call = lambda: kernel[(splits, batch * heads)](q, k, v, o, ml, seqlen, scale_log2, H=heads, G=group, D=dim,  # noqa: E731
                                                    SPLITS=splits, BLOCK_N=block_n, ITERS=iters, PDL=pdl, num_warps=warps)
    compiled = call()
    print(f"  attention prototype {splits}x{block_n}x{warps}: {getattr(compiled, 'n_regs', '?')} registers, "
          f"{getattr(compiled, 'n_spills', '?')} spills, {getattr(getattr(compiled, 'metadata', None), 'shared', '?')} B "
          "shared memory", flush=True)
    parts_m = ml[..., 0].view(batch * heads, splits, 16)[..., :group]
    parts_l = ml[..., 1].view(batch * heads, splits, 16)[..., :group]
    parts_o = o.view(batch * heads, splits, 16, dim)[:, :, :group]
    m_all = parts_m.max(dim=1, keepdim=True).values
    w = torch.exp2(parts_m - m_all) * (parts_l > 0)
    out = (parts_o * w[..., None]).sum(1) / (parts_l * w).sum(1)[..., None]
    expect = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True)
    expect = expect.transpose(1, 2).reshape(batch * heads, group, dim).float()
    err = (out - expect).abs().max().item()
    assert err < 2e-2, f"split attention prototype is wrong: max error {err}"
    if not merge:
        return call
    merged = torch.empty_like(q)
    merger = merge_partials_kernel()
    both = lambda: (call(), merger[(batch * heads, group)](o, ml, merged, H=heads, G=group, D=dim, SPLITS=splits,  # noqa: E731
                                                            PDL=pdl, num_warps=4, launch_pdl=pdl))
    both()
    err = (merged.reshape(batch * heads, group, dim).float() - expect).abs().max().item()
    assert err < 2e-2, f"split attention prototype + merge ({merge}) is wrong: max error {err}"
    return both


def merge_calls(k, v, splits: int, warps: int = 4, merge: bool = True):
    """One read of K and V with the merge in the last CTA of each KV head (read_merge_kernel), `splits` per head;
    checked once against torch's sum before it is timed."""
    import torch
    import triton

    batch, seqlen, heads, dim = k.shape
    keys = triton.cdiv(seqlen, splits)
    block_n = min(32, triton.next_power_of_2(keys))
    iters = triton.cdiv(keys, block_n)
    part = torch.empty(batch * heads, splits, dim, device=k.device, dtype=torch.float32)
    count = torch.zeros(batch * heads, device=k.device, dtype=torch.int32)
    out = torch.empty(batch * heads, dim, device=k.device, dtype=torch.float32)
    kernel = read_merge_kernel()
    call = lambda: kernel[(splits, batch * heads)](k, v, part, count, out, seqlen, H=heads, D=dim, SPLITS=splits,  # noqa: E731
                                                    BLOCK_N=block_n, ITERS=iters, MERGE=merge, num_warps=warps)
    call()
    if not merge:
        return call
    expect = (k.float().sum(1) + v.float().sum(1)).reshape(batch * heads, dim)
    err = (out - expect).abs().max().item()
    assert err < 1e-2 * expect.abs().max().item() + 1e-2, f"read+merge floor kernel is wrong: max error {err}"
    assert int(count.sum().item()) == 0, "the last CTA did not reset its counter"
    return call


def floor_calls(k, v, grid_shape):
    """One read of K and V by read_kv with (BLOCK, ITERS, num_warps) = grid_shape."""
    import torch
    import triton

    kernel = read_kernel()
    block, iters, warps = grid_shape
    n = k.numel()
    programs = triton.cdiv(n, block * iters)
    out = torch.empty(programs, device=k.device, dtype=torch.float32)
    return lambda: kernel[(programs,)](k, v, out, n, BLOCK=block, ITERS=iters, num_warps=warps)


def decode_cluster_call(experiment, q, k, v):
    """The sm120_decode_cluster class (its one config) on these tensors, checked against torch SDPA once."""
    import torch.nn.functional as F

    from fa4tune.config import ForwardConfig

    cfg = ForwardConfig(16, 64, 256, 1, False, kernel="sm120_decode_cluster")
    out = experiment.attention(q, k, v, causal=False, fwd_config=cfg)
    expect = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True)
    err = (out.float() - expect.transpose(1, 2).float()).abs().max().item()
    assert err < 2e-2, f"sm120_decode_cluster is wrong: max error {err}"
    return lambda: experiment.attention(q, k, v, causal=False, fwd_config=cfg)


def candidates_for(problem, experiment, sets: int, grids=GRIDS, merge_splits=(), attention=(),
                   merge_attention=False, cluster_cuda=(), decode_cluster=False):
    """name -> one call per input set."""
    import torch
    import torch.nn.functional as F

    from fa4tune import defaults

    gen = torch.Generator(device="cuda").manual_seed(0)
    tensors = []
    for _ in range(sets):
        shape = lambda s, h, d: (problem.batch, s, h, d)  # noqa: E731
        q = torch.randn(shape(problem.seqlen_q, problem.num_heads, problem.head_dim), device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(shape(problem.seqlen_k, problem.num_heads_kv, problem.head_dim), device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn(shape(problem.seqlen_k, problem.num_heads_kv, problem.head_dim_v), device="cuda", dtype=torch.bfloat16, generator=gen)
        tensors.append((q, k, v))
    tiny = torch.zeros(1, device="cuda")
    pc = problem.problem_class
    table, upstream = experiment.forward_config(pc), defaults.upstream_forward(pc)
    out = {
        "events only": [lambda: None] * sets,
        "one tiny kernel": [lambda: tiny.add_(1)] * sets,
    }
    for grid_shape in grids:
        programs = -(-tensors[0][1].numel() // (grid_shape[0] * grid_shape[1]))
        out[f"read K+V ({'x'.join(map(str, grid_shape))}: {programs} CTAs)"] = [
            floor_calls(k, v, grid_shape) for _, k, v in tensors]
    for splits in merge_splits:
        out[f"read K+V per head, partials ({splits} splits, 4 warps)"] = [
            merge_calls(k, v, splits, 4, merge=False) for _, k, v in tensors]
        out[f"read K+V + merge in last CTA ({splits} splits, 4 warps)"] = [
            merge_calls(k, v, splits, 4) for _, k, v in tensors]
    for splits, block_n, warps in attention:
        for merge, what in (("", "no merge"), ("stream", "+ merge kernel"), ("pdl", "+ PDL merge kernel")):
            if merge and not merge_attention:
                continue
            out[f"attention {what} ({splits}x{block_n}x{warps}: {splits * problem.num_heads_kv * problem.batch} CTAs)"] = [
                split_attention_calls(q, k, v, splits, block_n, warps, merge) for q, k, v in tensors]
    for variant in cluster_cuda:
        import decode_cluster_cuda

        try:
            out[f"cluster-8 CUDA {variant} ({8 * problem.num_heads_kv * problem.batch} CTAs)"] = [
                decode_cluster_cuda.calls(q, k, v, variant) for q, k, v in tensors]
        except (AssertionError, RuntimeError) as e:  # a wrong or failing variant is reported, the others still run
            print(f"  cluster-8 CUDA {variant}: not timed: {e}", flush=True)
    if decode_cluster:
        try:
            out["sm120_decode_cluster 16x64x256"] = [decode_cluster_call(experiment, q, k, v) for q, k, v in tensors]
        except (AssertionError, RuntimeError) as e:  # reported; the other candidates still run
            print(f"  sm120_decode_cluster: not timed: {e}", flush=True)
    two = [floor_calls(k, v, GRIDS[1]) for _, k, v in tensors]
    out["read K+V + tiny kernel"] = [(lambda f: lambda: (f(), tiny.add_(1)))(f) for f in two]
    out[f"table: {table.kernel} {table.tile_m}x{table.tile_n}"] = [
        (lambda q, k, v: lambda: experiment.attention(q, k, v, causal=problem.causal, fwd_config=table))(*t) for t in tensors]
    out["upstream default"] = [
        (lambda q, k, v: lambda: experiment.attention(q, k, v, causal=problem.causal, fwd_config=upstream))(*t) for t in tensors]
    out["torch sdpa"] = [
        (lambda q, k, v: lambda: F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                                 is_causal=problem.causal, enable_gqa=True))(*t)
        for t in tensors]
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="decode")
    parser.add_argument("--only", default="", help="problems whose label contains this")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (default: the harness's)")
    parser.add_argument("--grids", default="", help="more read-kernel shapes, BLOCKxITERSxWARPS,... (for example "
                        "4096x16x8: 64 CTAs at a b1 4K decode, what a one-cluster-per-KV-head kernel could have)")
    parser.add_argument("--merge-splits", default="", help="splits per KV head of the read-and-merge floor kernel, "
                        "comma-separated (one kernel: the reads, then the last CTA of a head merges the partials)")
    parser.add_argument("--attention", default="", help="split attention prototypes (registers, no merge), "
                        "SPLITSxBLOCK_NxWARPS,... (for example 8x64x16: 8 splits per KV head, 64 keys per load, 16 warps)")
    parser.add_argument("--merge-attention", action="store_true", help="each --attention prototype also with its "
                        "merge kernel, launched after it and as its programmatic dependent (PDL)")
    parser.add_argument("--cluster-cuda", default="", help="variants of bench/decode_cluster_cuda.py's one-kernel "
                        "cluster decode, comma-separated (fma, fma_ra8, mma; the floors fma_floor, mma_floor, their "
                        "_local builds without the cluster merge, and read_1024x8, read_512x16 (_local), read_512x8_local)")
    parser.add_argument("--decode-cluster", action="store_true", help="also the sm120_decode_cluster class "
                        "(kernels/decode_cluster_forward_sm120.py), checked against SDPA, then timed")
    args = parser.parse_args(argv)

    import torch

    from fa4tune.harness import gpu
    from fa4tune.harness.candidates import load_experiment
    from fa4tune.harness.settings import EXPERIMENT_PATH, Settings
    from fa4tune.harness.steps import make_flusher
    from fa4tune.harness.timing import CudaEventTimer, benchmark
    from fa4tune.targets import get_target

    settings = Settings(gate_seed=0)  # no gate here; the seed is unused
    experiment = load_experiment(EXPERIMENT_PATH)
    device = torch.device("cuda")
    name = torch.cuda.get_device_properties(device).name
    mode = gpu.select_mode(gpu.read_device(), get_target())
    print(f"device {name}; mode {mode} (SM120 kernels{' emulated on this device' if mode == 'emulated' else ''}; "
          "the floors and SDPA are this device's own kernels)")
    flusher = make_flusher(device)
    rounds = args.rounds or settings.rounds
    for problem in [p for p in load_suite(args.suite) if args.only in p.label and not p.causal]:
        kv_bytes = problem.batch * problem.seqlen_k * problem.num_heads_kv * (problem.head_dim + problem.head_dim_v) * 2
        grids = GRIDS + tuple(tuple(int(x) for x in g.split("x")) for g in args.grids.split(",") if g)
        merge = tuple(int(x) for x in args.merge_splits.split(",") if x)
        attention = tuple(tuple(int(x) for x in a.split("x")) for a in args.attention.split(",") if a)
        calls = candidates_for(problem, experiment, settings.input_sets, grids, merge, attention,
                               args.merge_attention, tuple(v for v in args.cluster_cuda.split(",") if v),
                               args.decode_cluster)
        results = benchmark(calls, timer=CudaEventTimer(), flush=flusher, warmup=settings.warmup, rounds=rounds)
        medians = {label: statistics.median(t.samples_ms) for label, t in results.items()}
        upstream = medians["upstream default"]
        print(f"\n== {problem.label}: K+V {kv_bytes / 1e6:.1f} MB; upstream {upstream:.4f} ms, 10x upstream {upstream / 10:.4f} ms ==")
        print(f"{'candidate':44} {'median ms':>10} {'min ms':>9} {'max ms':>9} {'upstream / it':>14} {'K+V GB/s':>9}")
        for label, t in results.items():
            med = medians[label]
            print(f"{label:44} {med:10.4f} {min(t.samples_ms):9.4f} {max(t.samples_ms):9.4f} {upstream / med:14.2f} "
                  f"{kv_bytes / med / 1e6:9.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
