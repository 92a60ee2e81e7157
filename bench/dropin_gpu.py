"""Issue 69's GPU checks of the drop-in (fa4tune.dropin), one step per argument; prints what each shows.

    python3 bench/dropin_gpu.py compile   # torch.compile(fullgraph=True) of a layer calling ours: no graph break,
                                          # forward and backward equal to eager (window + softcap call included)
    python3 bench/dropin_gpu.py graphs    # CUDA graphs: a prefill and a split-KV decode captured, replayed on new inputs,
                                          # equal to eager on those inputs (and a decode with seqused_k, checked as below)
    python3 bench/dropin_gpu.py seqused   # KV-cache decodes with seqused_k: the split-KV class ran them (debug line),
                                          # each sequence within the gate's bound of the fp32 reference on its used keys
    python3 bench/dropin_gpu.py window    # MODELS' real window / softcap settings: ours and upstream's SM120 config
                                          # gated against the fp32 reference with the same window and softcap, timed
    python3 bench/dropin_gpu.py hf        # a random-weight Llama from a config: attn_implementation "fa4tune" vs "sdpa"
    python3 bench/dropin_gpu.py local     # the TMA classes' window loop (blocks from n_block_min, the left edge's masked):
                                          # each class gated on windows of 0 to 500 keys (and one with a right side, and
                                          # a soft-cap) against the fp32 reference; then gpt-oss's and Mistral's sliding
                                          # layers timed on upstream's SM80 loop (every block down to 0) and on TMA configs
    python3 bench/dropin_gpu.py window-decode  # the split-KV class with a window or soft-cap: gated on every window, at two split
                                          # counts, contiguous and paged; the models' window / soft-cap decodes timed vs upstream
    python3 bench/dropin_gpu.py softcap   # Gemma 2 27B's soft-cap layers: upstream's SM120 config, the studies' winner
                                          # (whose sm_90a occupancy is not sm_120a's) and configs whose occupancy agrees,
                                          # gated and timed interleaved
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import DebugLines, gpu_script_main  # noqa: E402

# (label, batch, seqlen, heads, heads_kv, head_dim, window_size_left, softcap, source): the models' config.json values
MODELS = [
    ("Mistral 7B v0.1 (window 4096)", 1, 8192, 32, 8, 128, 4096, 0.0,
     "mistralai/Mistral-7B-v0.1 config.json: sliding_window 4096, 32 heads, 8 KV heads, head_dim 128"),
    ("Gemma 2 9B local layer", 1, 8192, 16, 8, 256, 4096, 50.0,
     "google/gemma-2-9b config.json: sliding_window 4096, attn_logit_softcapping 50.0, 16 heads, 8 KV, head_dim 256"),
    ("Gemma 2 9B global layer", 1, 8192, 16, 8, 256, -1, 50.0,
     "google/gemma-2-9b config.json: attn_logit_softcapping 50.0 on every layer, global ones unwindowed"),
    ("Gemma 3 12B local layer", 1, 8192, 16, 8, 256, 1024, 0.0,
     "google/gemma-3-12b-pt config.json: sliding_window 1024, 16 heads, 8 KV heads, head_dim 256"),
    ("Gemma 2 27B local layer", 1, 8192, 32, 16, 128, 4096, 50.0,
     "google/gemma-2-27b config.json: sliding_window 4096, attn_logit_softcapping 50.0, 32 heads, 16 KV, head_dim 128"),
    ("Gemma 2 27B global layer 8k (held out)", 1, 8192, 32, 16, 128, -1, 50.0,
     "google/gemma-2-27b config.json: attn_logit_softcapping 50.0, global layers unwindowed; the suite's row is 4k"),
    ("Gemma 3 27B local layer", 1, 8192, 32, 16, 128, 1024, 0.0,
     "google/gemma-3-27b-it config.json: text_config.sliding_window 1024, 32 heads, 16 KV heads, head_dim 128"),
    ("Mistral 7B 2 x 12k (held out)", 2, 12288, 32, 8, 128, 4096, 0.0,
     "mistralai/Mistral-7B-v0.1 config.json: sliding_window 4096; a shape no study tuned on (the suite's is 1 x 8k)"),
]


def _tensors(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, grad=False, seed=0):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    shapes = ((batch, seqlen_q, heads, head_dim), (batch, seqlen_k, heads_kv, head_dim), (batch, seqlen_k, heads_kv, head_dim))
    return [torch.randn(s, generator=g, device="cuda", dtype=torch.bfloat16).requires_grad_(grad) for s in shapes]


def _max_diff(a, b) -> float:
    return (a.float() - b.float()).abs().max().item()


SPLIT = "kernel=sm120_splitkv"  # a config's short() names its kernel class


def kv_cache_failures(label: str, out, q, k, v, used, lines: list[str]) -> int:
    """A causal decode's output with seqused_k against the fp32 reference of each sequence on its used keys (the gate's
    bound: 2 x the bf16 reference's error + 1e-4), and the split-KV class having run it (the call's debug line)."""
    import torch

    from fa4tune.harness import gate

    ran = [line for line in lines if "tuned forward" in line]
    failures = int(not ran or any(SPLIT not in line or "upstream's SM120 config" in line for line in ran))
    worst, bound = 0.0, 0.0
    for b, n in enumerate(used.tolist()):
        args = (q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n], True)
        ref, low = gate.reference_attention(*args), gate.reference_attention(*args, dtype=torch.bfloat16)
        err, limit = _max_diff(out[b:b + 1], ref.out), 2 * _max_diff(low.out, ref.out) + 1e-4
        failures += err > limit
        worst, bound = max(worst, err), max(bound, limit)
    print(f"{label}: used {used.tolist()[:8]}: vs fp32 reference per sequence max |diff| {worst:.3g} (bound {bound:.3g}); "
          f"ran: {ran[-1] if ran else 'no tuned forward'}")
    return failures


def compile_step() -> int:
    import torch

    from fa4tune.dropin import flash_attn_func

    def layer(q, k, v):
        a, _ = flash_attn_func(q, k, v, causal=True)
        b, _ = flash_attn_func(q, k, v, causal=True, window_size=(256, 0), softcap=30.0)
        return a + b

    failures = 0
    explained = torch._dynamo.explain(layer)(*_tensors(2, 1024, 1024, 16, 4, 128))
    print(f"graph breaks: {explained.graph_break_count}, graphs: {explained.graph_count}")
    failures += explained.graph_break_count != 0
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True)
    for seed in range(2):
        q, k, v = _tensors(2, 1024, 1024, 16, 4, 128, grad=True, seed=seed)
        eager = layer(q, k, v)
        eager.sum().backward()
        grads = [t.grad.clone() for t in (q, k, v)]
        for t in (q, k, v):
            t.grad = None
        out = compiled(q, k, v)
        out.sum().backward()
        diffs = [_max_diff(out, eager)] + [_max_diff(t.grad, g) for t, g in zip((q, k, v), grads)]
        # the forward is bit-exact; the default backward adds dQ (and GQA's dK, dV) with fp32 atomics in whatever
        # order the CTAs reach them, so two eager runs differ too: a gradient may differ by 2 bf16 ulps of its
        # largest magnitude (2 * 2^-8 * max |g|), the rounding of a reordered fp32 sum
        bounds = [0.0] + [2 * 2.0 ** -8 * g.abs().max().item() for g in grads]
        print(f"fullgraph inductor vs eager, inputs {seed}: max |diff| out {diffs[0]:.3g} dq {diffs[1]:.3g} "
              f"dk {diffs[2]:.3g} dv {diffs[3]:.3g} (bounds: out 0, dq {bounds[1]:.3g}, dk {bounds[2]:.3g}, dv {bounds[3]:.3g})")
        failures += any(d > b for d, b in zip(diffs, bounds))
    return failures


def graphs_step() -> int:
    import torch

    from fa4tune.dropin import flash_attn_func, flash_attn_varlen_func

    failures = 0
    cases = {
        "prefill b2 s2048 hq32/hkv8 d128 causal": (lambda q, k, v, used: flash_attn_func(q, k, v, causal=True)[0],
                                                   (2, 2048, 2048, 32, 8, 128)),
        "decode b8 sq1 sk8192 hq32/hkv8 d128 (split-KV)": (lambda q, k, v, used: flash_attn_func(q, k, v, causal=True)[0],
                                                           (8, 1, 8192, 32, 8, 128)),
        "decode with seqused_k (a KV cache)": (lambda q, k, v, used: flash_attn_varlen_func(q, k, v, seqused_k=used,
                                                                                            causal=True)[0],
                                               (8, 1, 8192, 32, 8, 128)),
    }
    for label, (call, shape) in cases.items():
        static = _tensors(*shape, seed=0)
        used = torch.randint(1, shape[2] + 1, (shape[0],), device="cuda", dtype=torch.int32)
        with torch.no_grad():
            call(*static, used)  # compiles and fills the host's caches outside the capture
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                call(*static, used)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                captured = call(*static, used)
            for seed in (1, 2):
                fresh = _tensors(*shape, seed=seed)
                for s, f in zip(static, fresh):
                    s.copy_(f)
                used.copy_(torch.randint(1, shape[2] + 1, (shape[0],), device="cuda", dtype=torch.int32))
                graph.replay()
                torch.cuda.synchronize()
                with DebugLines() as lines:
                    eager = call(*fresh, used)
                diff = _max_diff(captured, eager)
                print(f"{label}: replay on new inputs {seed}: max |diff| vs eager {diff:.3g}")
                failures += diff != 0
                if "seqused_k" in label:
                    failures += kv_cache_failures(f"{label}, replay {seed}", captured, *fresh, used, lines)
    return failures


# (label, batch, seqlen_k (the cache's slots), heads, heads_kv, head_dim, used lengths or None (random), num_splits)
KV_CACHES = [
    ("b8 hq32/hkv8 d128, 8K slots", 8, 8192, 32, 8, 128, None, 1),
    ("b4 hq16/hkv2 d64, 32K slots, 1 to all", 4, 32768, 16, 2, 64, [1, 64, 4097, 32768], 1),
    ("b2 hq32/hkv8 d128, 16K slots, num_splits=8", 2, 16384, 32, 8, 128, [5000, 16384], 8),
    ("b16 hq32/hkv4 d128, 4K slots", 16, 4096, 32, 4, 128, None, 1),
]


def seqused_step() -> int:
    import torch

    from fa4tune import flash_attn_varlen_func

    failures = 0
    for label, batch, slots, heads, heads_kv, head_dim, lengths, splits in KV_CACHES:
        q, k, v = _tensors(batch, 1, slots, heads, heads_kv, head_dim)
        g = torch.Generator(device="cuda").manual_seed(batch)
        used = (torch.tensor(lengths, dtype=torch.int32, device="cuda") if lengths else
                torch.randint(1, slots + 1, (batch,), generator=g, device="cuda", dtype=torch.int32))
        with torch.no_grad(), DebugLines() as lines:
            out, _ = flash_attn_varlen_func(q, k, v, seqused_k=used, causal=True, num_splits=splits)
        failures += kv_cache_failures(label, out, q, k, v, used, lines)
    return failures


def _device_ms(candidates: dict, rounds: int) -> dict:
    """Median device milliseconds of each candidate (name -> call) on the harness's timer: rounds interleaved, the L2
    flushed before each call, every round behind a blocking kernel (so the host path's time is not counted)."""
    import torch

    from fa4tune.harness.steps import make_flusher
    from fa4tune.harness.timing import CudaEventTimer, benchmark

    timed = benchmark({name: [call] for name, call in candidates.items()}, timer=CudaEventTimer(),
                      flush=make_flusher(torch.device("cuda")), rounds=rounds)
    return {name: t.median_ms for name, t in timed.items()}


def window_step(repeats: int = 30) -> int:
    import torch

    from fa4tune.config import ConfigError

    from bench.common import geomean
    from fa4tune import api, defaults, torch_op
    from fa4tune.dropin import flash_attn_func
    from fa4tune.harness import gate

    failures, speedups = 0, []
    for label, batch, seqlen, heads, heads_kv, head_dim, left, softcap, source in MODELS:
        window = (left, 0) if left >= 0 else (None, None)
        q, k, v = _tensors(batch, seqlen, seqlen, heads, heads_kv, head_dim)
        extras = api.Extras(*window, softcap=softcap)
        pc = api.problem_class_of(q, k, v, True, extras=extras)
        upstream_config = defaults.upstream_forward(pc)
        from fa4tune.feasibility import check_forward_entry
        from fa4tune.targets import get_target

        fits = check_forward_entry(upstream_config, pc, get_target())

        def ours():
            return flash_attn_func(q, k, v, causal=True, window_size=window, softcap=softcap)[0]

        def upstream():
            return api.run_forward(torch_op.registry_class, q, k, v, True, head_dim ** -0.5, upstream_config, None,
                                   extras)[0]

        ref = gate.reference_attention(q, k, v, True, window_size=window, softcap=softcap)
        low = gate.reference_attention(q, k, v, True, window_size=window, softcap=softcap, dtype=torch.bfloat16)
        bound = 2 * _max_diff(low.out, ref.out) + 1e-4
        row = [f"{label:32s} {pc.name:40s}"]
        if not fits:
            row.append(f"upstream's SM120 config does not run it ({fits.rule})")
        candidates = dict((("ours", ours), ("upstream", upstream))[:2 if fits else 1])
        try:
            errors = {name: _max_diff(fn(), ref.out) for name, fn in candidates.items()}
        except ConfigError as err:  # no config of ours runs the class within SM120's 99 KB either: a row, not a crash
            print("  ".join(row) + f"  ours: {err}   # {source}")
            continue
        failures += sum(e > bound for e in errors.values())
        times = _device_ms(candidates, repeats)  # interleaved rounds, L2 flushed, behind a blocking kernel
        row += [f"{name} err {errors[name]:.3g} (bound {bound:.3g}) {times[name]:.3f} ms" for name in candidates]
        if fits:
            speedups.append(times["upstream"] / times["ours"])
        print("  ".join(row) + (f"  {speedups[-1]:.3f}x" if fits else "") + f"   # {source}")
    print(f"geomean speedup over upstream's SM120 config: {geomean(speedups) if speedups else float('nan'):.3f}x over "
          f"{len(speedups)} row(s) (a row whose class has no entry of its own runs upstream's config: 1.0x by construction)")
    return failures


# (label, batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, softcap): odd lengths, so tiles end mid-window
LOCAL_GATE = [("d64 GQA 8", 1, 1000, 1000, 16, 2, 64, 0.0), ("d128 GQA 4, sq < sk", 2, 777, 1500, 8, 2, 128, 0.0),
              ("d256 GQA 2 soft-cap 50", 1, 700, 700, 4, 2, 256, 50.0)]
LOCAL_WINDOWS = [(0, 0), (1, 0), (63, 0), (64, 0), (100, 0), (128, 0), (500, 0), (100, 50)]  # (left, right); right > 0: not causal
LOCAL_KERNELS = [("sm120_tma", 2, False), ("sm120_tma_lpt", 1, True), ("sm120_tma_paired", 2, False),
                 ("sm120_tma_trimmed", 1, True)]  # (kernel, num_stages, Q_in_regs): both load schedules
# the kernels gated per head dim (each (kernel, mask) pair is a compile of ~10 s in this one process): every class at
# d64, the two load schedules at d128, the wide-head class at d256
LOCAL_GATED = {64: LOCAL_KERNELS, 128: [LOCAL_KERNELS[0], LOCAL_KERNELS[3]], 256: [LOCAL_KERNELS[0]]}
LOCAL_TIMED_CONFIGS = [("sm120_tma_trimmed", 64, 1, True), ("sm120_tma_trimmed", 128, 1, True), ("sm120_tma", 128, 2, False)]
# (label, batch, seqlen, heads, heads_kv, head_dim, window_size_left): gpt-oss-20b's and Mistral 7B's sliding layers
LOCAL_TIMED = [("gpt-oss-20b sliding layer (window 128)", 1, 4096, 64, 8, 64, 128),
               ("Mistral 7B past its window (4096 of 8192)", 1, 8192, 32, 8, 128, 4096)]


def _time_against_upstream(label, shape, left, softcap, configs, repeats, upstream_name="upstream", seqlen_q=None) -> int:
    """One causal layer (batch, seqlen, heads, heads_kv, head_dim; seqlen_q queries over them, default all) with a
    window's left side (-1: none) and a soft-cap: upstream's SM120 config and each (name, ForwardConfig) that SM120's
    rules accept (a None config: the dispatch table's entry), gated against the fp32 reference with the same window
    and soft-cap, then timed interleaved; a row per candidate. Returns the gate's failures."""
    import torch

    from fa4tune import api, defaults, torch_op
    from fa4tune.feasibility import check_forward_entry
    from fa4tune.harness import gate
    from fa4tune.targets import get_target

    batch, seqlen, heads, heads_kv, head_dim = shape
    window = (left, 0) if left >= 0 else (None, None)
    q, k, v = _tensors(batch, seqlen if seqlen_q is None else seqlen_q, seqlen, heads, heads_kv, head_dim)
    extras = api.Extras(*window, softcap=softcap)
    pc = api.problem_class_of(q, k, v, True, extras=extras)
    configs = [(name, torch_op.tables_in_use().forward_config(pc) if config is None else config)
               for name, config in configs]
    ref = gate.reference_attention(q, k, v, True, window_size=window, softcap=softcap)
    low = gate.reference_attention(q, k, v, True, window_size=window, softcap=softcap, dtype=torch.bfloat16)
    bound = 2 * _max_diff(low.out, ref.out) + 1e-4
    chosen = {upstream_name: defaults.upstream_forward(pc)}
    for name, config in configs:
        verdict = check_forward_entry(config, pc, get_target())
        if verdict:
            chosen[name] = config
        else:
            print(f"{label:44s} {name:44s} refused by SM120's rules: {verdict.rule}")
    calls = {name: (lambda c=c: api.run_forward(torch_op.registry_class, q, k, v, True, head_dim ** -0.5, c, None,
                                                extras)[0]) for name, c in chosen.items()}
    errors = {name: _max_diff(call(), ref.out) for name, call in calls.items()}
    times = _device_ms(calls, repeats)
    base = times[upstream_name]
    for name in calls:
        print(f"{label:44s} {name:44s} {errors[name]:9.3g} {times[name]:8.3f} {base / times[name]:10.3f}x"
              + ("  FAIL" if errors[name] > bound else ""))
    return sum(err > bound for err in errors.values())


def local_step(repeats: int = 30) -> int:
    import torch

    from fa4tune import api, torch_op
    from fa4tune.config import ForwardConfig
    from fa4tune.feasibility import check_forward_entry
    from fa4tune.harness import gate
    from fa4tune.targets import get_target

    def config_for(kernel, stages, q_in_regs, head_dim):
        tile_n = 32 if head_dim > 128 else 64  # d256: 64 x 32 tiles fit 99 KB
        return ForwardConfig(tile_m=64, tile_n=tile_n, num_threads=128, num_stages=stages, Q_in_regs=q_in_regs,
                             kernel=kernel)

    failures = 0
    print(f"{'problem':24s} {'window':>10s} " + "  ".join(f"{k:>18s}" for k, *_ in LOCAL_KERNELS) + "   bound  (. not gated)")
    for label, batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, softcap in LOCAL_GATE:
        q, k, v = _tensors(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim)
        for left, right in LOCAL_WINDOWS:
            causal = right == 0
            extras = api.Extras(left, right if not causal else 0, softcap=softcap)
            pc = api.problem_class_of(q, k, v, causal, extras=extras)
            window = (left, right)
            ref = gate.reference_attention(q, k, v, causal, window_size=window, softcap=softcap)
            low = gate.reference_attention(q, k, v, causal, window_size=window, softcap=softcap, dtype=torch.bfloat16)
            bound = 2 * _max_diff(low.out, ref.out) + 1e-4
            cells = []
            for kernel, stages, q_in_regs in LOCAL_KERNELS:
                if (kernel, stages, q_in_regs) not in LOCAL_GATED[head_dim]:
                    cells.append(f"{'.':>18s}")
                    continue
                config = config_for(kernel, stages, q_in_regs, head_dim)
                verdict = check_forward_entry(config, pc, get_target())
                if not verdict:
                    cells.append(f"{'refused ' + verdict.rule:>18s}"[:18])
                    continue
                out, lse = api.run_forward(torch_op.registry_class, q, k, v, causal, head_dim ** -0.5, config, None, extras)
                err = _max_diff(out, ref.out)
                lse_err = _max_diff(lse, ref.lse) if ref.lse is not None else 0.0
                bad = err > bound or not torch.isfinite(out).all() or lse_err > 1e-2
                failures += int(bad)
                cells.append(f"{('FAIL ' if bad else 'ok ') + f'{err:.2g}':>18s}")
            print(f"{label:24s} {str(window):>10s} " + "  ".join(cells) + f"   {bound:.2g}")
    print(f"\n{'layer':44s} {'candidate':44s} {'err':>9s} {'ms':>8s} {'vs upstream':>11s}")
    for label, batch, seqlen, heads, heads_kv, head_dim, left in LOCAL_TIMED:
        configs = [(f"{kernel} {tile_m}x64 s{stages}{' Qregs' if q_in_regs else ''}",
                    ForwardConfig(tile_m=tile_m, tile_n=64, num_threads=128, num_stages=stages, Q_in_regs=q_in_regs,
                                  kernel=kernel)) for kernel, tile_m, stages, q_in_regs in LOCAL_TIMED_CONFIGS]
        failures += _time_against_upstream(label, (batch, seqlen, heads, heads_kv, head_dim), left, 0.0, configs,
                                           repeats, "upstream (SM80 loop, sm120)")
    return failures


# Gemma 2 27B's soft-cap layers (MODELS' settings): the studies' winner (64x32 trimmed, Q in registers) takes 190
# registers on sm_120a (2 CTAs per SM) but 168 on sm_90a (3), so its emulated time is not SM120's; the others give
# both arches the same CTAs per SM (docs/measurements/logs/2026-12-07-s14-softcap-candidates-fidelity.txt)
SOFTCAP_TIMED = [("Gemma 2 27B local layer", (1, 8192, 32, 16, 128), 4096),
                 ("Gemma 2 27B global layer (the suite's 4k)", (1, 4096, 32, 16, 128), -1),
                 ("Gemma 2 27B global layer 8k (held out)", (1, 8192, 32, 16, 128), -1)]
SOFTCAP_CONFIGS = [
    ("trimmed 64x32 s1 Qregs (studies; flagged)", dict(tile_m=64, tile_n=32, num_threads=128, num_stages=1,
                                                       Q_in_regs=True, kernel="sm120_tma_trimmed")),
    ("trimmed 64x32 s1", dict(tile_m=64, tile_n=32, num_threads=128, num_stages=1, Q_in_regs=False,
                              kernel="sm120_tma_trimmed")),
    ("lpt 128x32 t256 s1 (runner-up)", dict(tile_m=128, tile_n=32, num_threads=256, num_stages=1, Q_in_regs=False,
                                            kernel="sm120_tma_lpt")),
]


def softcap_step(repeats: int = 30) -> int:
    from fa4tune.config import ForwardConfig

    configs = [(name, ForwardConfig(**fields)) for name, fields in SOFTCAP_CONFIGS]
    print(f"{'layer':44s} {'candidate':44s} {'err':>9s} {'ms':>8s} {'vs upstream':>11s}")
    return sum(_time_against_upstream(label, shape, left, 50.0, configs, repeats)
               for label, shape, left in SOFTCAP_TIMED)


# Split-KV decodes with a sliding window or a soft-cap (the class declares `local` and `softcap` since 2026-12-07 s15:
# its splits divide the window's blocks): (label, batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, softcap,
# windows), seqlen_k never a tile multiple; the soft-cap case (Gemma 2's) without a window ((-1, -1)) and with two
WINDOW_DECODE_GATE = [("decode d128 GQA 4", 2, 1, 3000, 32, 8, 128, 0.0, LOCAL_WINDOWS),
                      ("8 queries d64 GQA 8", 1, 8, 1500, 64, 8, 64, 0.0, LOCAL_WINDOWS),
                      ("decode d128 GQA 2 soft-cap 50", 2, 1, 2500, 32, 16, 128, 50.0, [(-1, -1), (128, 0), (500, 0)])]
WINDOW_DECODE_SPLITS = (0, 4)  # the heuristic's count, and 4 forced (the split path whatever the heuristic says;
# at most the window's KV blocks: window_decode_cases)
WINDOW_DECODE_PAGES = (16, 64)  # pages of the first case's cache, window (128, 0), the heuristic's splits
# the split-KV config the gate runs (experiment.py's DECODE, the decode classes' entry; a test holds them equal)
SPLIT_DECODE = dict(tile_m=32, tile_n=64, num_threads=64, num_stages=2, Q_in_regs=False, kernel="sm120_splitkv")
# the models suite's decodes with a window or a soft-cap: (label, batch, seqlen_k, heads, heads_kv, head_dim,
# window_size_left (-1: none), softcap)
WINDOW_DECODE_TIMED = [("Mistral 7B decode b16 16k (window 4096)", 16, 16384, 32, 8, 128, 4096, 0.0),
                       ("Gemma 3 27B decode b1 32k (window 1024)", 1, 32768, 32, 16, 128, 1024, 0.0),
                       ("Gemma 2 27B global decode b1 8k (soft-cap 50)", 1, 8192, 32, 16, 128, -1, 50.0),
                       ("Gemma 2 27B local decode b16 8k (4096, 50)", 16, 8192, 32, 16, 128, 4096, 50.0),
                       ("gpt-oss-20b sliding decode b16 8k (window 128)", 16, 8192, 64, 8, 64, 128, 0.0)]


def window_decode_cases():
    """(label, Problem, num_splits) of the window-decode step's gate, contiguous then paged; an explicit split count at
    most the KV blocks the window leaves (a 1-key window reads 2 blocks)."""
    from fa4tune.config import ForwardConfig, Problem
    from kernels.splitkv_forward_sm120 import SPLITS_DOMAIN, SplitKvForwardSm120

    cases = []
    for label, batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, softcap, gate_windows in WINDOW_DECODE_GATE:
        windows = [(window, 0) for window in gate_windows]
        windows += [((128, 0), page) for page in WINDOW_DECODE_PAGES] if label == WINDOW_DECODE_GATE[0][0] else []
        for (left, right), page in windows:
            problem = Problem(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, head_dim, right <= 0,
                              backward=False, window_size_left=left, window_size_right=right, softcap=softcap,
                              page_size=page)
            blocks = SplitKvForwardSm120.num_n_blocks(ForwardConfig(**SPLIT_DECODE), problem)
            for splits in WINDOW_DECODE_SPLITS[:1] if page else WINDOW_DECODE_SPLITS:
                fits = [d for d in SPLITS_DOMAIN if 0 < d <= min(splits, blocks)]  # the knob's values only
                cases.append((label, problem, max(fits) if splits else 0))
    return cases


def window_decode_step(repeats: int = 30) -> int:
    """The split-KV class with a window or a soft-cap: gated (out and LSE, the gate's own rule) on every LOCAL_WINDOWS
    window at each split count, contiguous and paged, and soft-capped with and without a window; then the suite's
    window and soft-cap decodes timed on upstream's SM120 config (the SM80 loop, unsplit, reads every key block)
    against the decode entry's config (experiment.DECODE), which reads the window's blocks."""
    import torch

    from bench.paged_gpu import scatter_pages
    from fa4tune import api, torch_op
    from fa4tune.config import ForwardConfig
    from fa4tune.feasibility import check_forward_problem
    from fa4tune.harness import gate
    from fa4tune.targets import get_target

    def run(q, k, v, causal, config, extras):
        return api.run_forward(torch_op.registry_class, q, k, v, causal, q.shape[-1] ** -0.5, config, None, extras)

    failures = 0
    print(f"{'case':24s} {'window':>10s} {'splits':>6s} {'page':>4s}  gate (worst error / tolerance)")
    tensors_of = {}
    for label, problem, splits in window_decode_cases():
        p = problem
        if label not in tensors_of:
            tensors_of[label] = _tensors(p.batch, p.seqlen_q, p.seqlen_k, p.num_heads, p.num_heads_kv, p.head_dim)
        q, k, v = tensors_of[label]
        window, causal, page, softcap = (p.window_size_left, p.window_size_right), p.causal, p.page_size, p.softcap
        config = ForwardConfig(**SPLIT_DECODE, extra={"num_splits": splits})
        if page:
            keys = -(-p.seqlen_k // page) * page  # the pool holds whole pages; the used keys stay seqlen_k
            pad = torch.zeros(p.batch, keys - p.seqlen_k, p.num_heads_kv, p.head_dim, device="cuda", dtype=k.dtype)
            (k_pool, table), (v_pool, _) = (scatter_pages(torch.cat([x, pad], 1), page, seed=page) for x in (k, v))
            used = torch.full((p.batch,), p.seqlen_k, dtype=torch.int32, device="cuda")
            extras, args = api.Extras(*window, page_table=table, seqused_k=used), dict(page_table=table, seqused_k=used)
            tensors = (q, k_pool, v_pool)
        else:
            extras, args, tensors = api.Extras(*window, softcap=softcap), dict(softcap=softcap), (q, k, v)
        verdict = check_forward_problem(config, p, get_target())
        if not verdict:
            failures += 1
            print(f"{label:24s} {str(window):>10s} {splits:6d} {page:4d}  REFUSED {verdict.rule}: {verdict.message}")
            continue
        with torch.no_grad():
            out, lse = run(*tensors, causal, config, extras)
        result = gate.check_outputs(*tensors, causal, out, lse, window_size=window, **args)
        failures += not result.passed
        worst = max(result.checks, key=lambda c: c.error / c.tolerance if c.tolerance else float("inf"))
        print(f"{label:24s} {str(window):>10s} {splits:6d} {page:4d}  "
              + (f"ok {worst.name} {worst.error:.3g} / {worst.tolerance:.3g}" if result.passed
                 else f"FAILED {result.reason[:160]}"))
    print(f"\n{'layer':44s} {'candidate':44s} {'err':>9s} {'ms':>8s} {'vs upstream':>11s}")
    configs = [("split-KV, the decode entry's config", ForwardConfig(**SPLIT_DECODE, extra={"num_splits": 0})),
               ("the table's entry (dispatch)", None)]
    for label, batch, seqlen_k, heads, heads_kv, head_dim, left, softcap in WINDOW_DECODE_TIMED:
        failures += _time_against_upstream(label, (batch, seqlen_k, heads, heads_kv, head_dim), left, softcap, configs,
                                           repeats, "upstream (SM80 loop, every block)", seqlen_q=1)
    return failures


def hf_step() -> int:
    import torch
    import transformers

    from fa4tune import hf_attention

    hf_attention.register()
    config = transformers.LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=4096)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()
    ids = torch.randint(0, 32000, (2, 1024), device="cuda")
    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        sdpa = model(ids).logits.float()
        model.set_attn_implementation("fa4tune")
        ours = model(ids).logits.float()
        # The referee: the same weights in fp32 on SDPA. A random-weight model's logits are nearly flat, so two bf16
        # runs disagree on many near-ties; each bf16 run is held to the fp32 model instead, ours within 2x SDPA's error.
        model.set_attn_implementation("sdpa")
        ref = model.float()(ids).logits
    err = {name: _max_diff(out, ref) for name, out in (("fa4tune", ours), ("sdpa", sdpa))}
    agree = {name: (out.argmax(-1) == ref.argmax(-1)).float().mean().item() for name, out in (("fa4tune", ours),
                                                                                             ("sdpa", sdpa))}
    print("Llama (random weights, 4 layers, GQA 4, d128, bf16) against the fp32 model: "
          + "; ".join(f"{name} max |diff| {err[name]:.3g}, top-1 agreement {agree[name]:.4f}" for name in err)
          + f"; fa4tune vs sdpa max |diff| {_max_diff(ours, sdpa):.3g} of {ref.abs().max().item():.3g}")
    failed = err["fa4tune"] > 2 * err["sdpa"] + 1e-3 or agree["fa4tune"] < agree["sdpa"] - 0.01
    return int(failed)


STEPS = {"compile": compile_step, "graphs": graphs_step, "seqused": seqused_step, "window": window_step, "hf": hf_step,
         "local": local_step, "softcap": softcap_step,
         "window-decode": window_decode_step}


def main(argv: list[str]) -> int:
    return gpu_script_main(STEPS, argv)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
