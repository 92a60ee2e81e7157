"""Issue 71's GPU checks of paged KV decode (a page table into K/V page pools, our split-KV class), one step per argument:

    python3 bench/paged_gpu.py gate     # pages of 16, 64 and 256 tokens, shuffled, sequences of different used lengths
                                        # (1 key to all): each sequence within the gate's rule of the fp32 reference
                                        # on its gathered keys; the paged class ran (debug line); the same decode on
                                        # the contiguous cache the pages hold: bit-identical where the config is
    python3 bench/paged_gpu.py time     # Llama 3 8B decodes: paged (16 / 64 / 256) vs the same decode on a contiguous
                                        # cache (target: within 5 %) vs torch SDPA's decode, gated first, then timed
                                        # interleaved in one step per shape (the harness's timer: a blocking kernel
                                        # ahead of each round, L2 flushed before every call), medians; and the
                                        # shuffle's floor: the same pages copied out by torch's index_select,
                                        # shuffled against in order (no attention: what the memory system charges)
    python3 bench/paged_gpu.py graphs   # the paged decode captured in a CUDA graph, replayed on new q, new pages, a new
                                        # table and new used lengths: each replay within the gate's rule of the fp32
                                        # reference and bit-identical to the eager call on the same inputs
A step's last line: "<step>: ok" or "<step>: N failed"; exit 1 when any failed, 2 for an unknown step.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import DebugLines, gpu_script_main  # noqa: E402

PAGE_SIZES = (16, 64, 256)
WITHIN = 1.05  # the target: a paged decode within 5 % of the same decode on a contiguous cache
# (label, batch, seqlen_q, slots per sequence, heads, kv heads, head_dim, causal, used lengths (None: drawn, the first
# full)); slots are multiples of 256, so that a contiguous cache and its pages hold the same keys per sequence
GATE_CASES = [
    ("llama3-8b decode b8, 8K slots", 8, 1, 8192, 32, 8, 128, True, None),
    ("hq16/hkv2 d64 decode, 32K slots, 1 key to all", 4, 1, 32768, 16, 2, 64, True, [1, 64, 4097, 32768]),
    ("hq32/hkv4 d96 decode b3, 4K slots", 3, 1, 4096, 32, 4, 96, False, None),
    ("llama3-8b chunk of 512 over 8K slots, causal", 2, 512, 8192, 32, 8, 128, True, [8192, 3000]),
]
# (label, batch, slots): Llama 3 8B's attention (32 query / 8 KV heads, d128, bf16), one query token, every slot used
TIME_CASES = [("llama3-8b decode b8 16k", 8, 16384), ("llama3-8b decode b1 64k", 1, 65536), ("llama3-8b decode b32 4k", 32, 4096)]
HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
IN_ORDER = "paged 16 in order"
# the shuffle's floor: torch's index_select reading the shuffled 16-token pages, against the same in order (ratio):
# whole pages (all KV heads' rows, contiguous), and by head (each KV head's rows of every page, head after head: the
# grain our kernel reads at, one KV head a CTA)
GATHER, GATHER_IN_ORDER = "gather 16", "gather 16 in order"
BY_HEAD, BY_HEAD_IN_ORDER = "gather 16 by head", "gather 16 by head in order"


def scatter_pages(cache, page_size: int, seed: int, in_order: bool = False):
    """(pool, page_table): a contiguous cache (batch, slots, heads, dim) cut into pages of page_size tokens, laid in a
    pool (num_pages, page_size, heads, dim) in an order drawn from `seed` (`in_order`: each sequence's pages one after
    the other, the contiguous cache's bytes read through the page table); table row b names sequence b's pages."""
    import torch

    batch, slots = cache.shape[:2]
    pages = slots // page_size
    generator = torch.Generator().manual_seed(seed)
    order = torch.arange(batch * pages) if in_order else torch.randperm(batch * pages, generator=generator)
    table = order.view(batch, pages).to(cache.device)
    pool = torch.empty(batch * pages, page_size, *cache.shape[2:], dtype=cache.dtype, device=cache.device)
    pool[table.flatten()] = cache.reshape(batch * pages, page_size, *cache.shape[2:])
    return pool, table.to(torch.int32)


def gather_by_head(pool, rows):
    """Each KV head's rows of the pool's pages `rows`, head after head: (heads, len(rows), page_size, words). Each
    row's head_dim is read as 8-byte words, so torch's index kernel moves the same bytes in as few elements as it can."""
    import torch

    return pool.view(torch.int64).permute(2, 0, 1, 3).index_select(1, rows)


def used_lengths(batch: int, slots: int, given, seed: int, low: int = 1):
    """int32 (batch,) used keys: `given`, or drawn from `seed` between `low` and slots with the first sequence full."""
    import torch

    if given is not None:
        return torch.tensor(given, dtype=torch.int32, device="cuda")
    generator = torch.Generator().manual_seed(seed)
    used = torch.randint(low, slots + 1, (batch,), generator=generator)
    used[0] = slots
    return used.to(device="cuda", dtype=torch.int32)


def _tensors(batch, seqlen_q, slots, heads, kv_heads, head_dim, seed):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(shape, generator=g, device="cuda", dtype=torch.bfloat16) for shape in
            ((batch, seqlen_q, heads, head_dim), (batch, slots, kv_heads, head_dim), (batch, slots, kv_heads, head_dim))]


def ran_paged(lines: list[str], page_size: int) -> str:
    """The debug line of a tuned forward of a page_size class on a class that runs pages, or '' when none ran so."""
    found = [line for line in lines if "tuned forward" in line]
    ok = found and f"-page{page_size}-" in found[-1] and "kernel=sm120_splitkv" in found[-1]
    return found[-1] if ok else ""


def config_of(line: str) -> str:
    """The config of a tuned forward's debug line ("fa4tune: tuned forward CLASS: CONFIG (why)"), '' for another."""
    if "tuned forward " not in line:
        return ""
    return line.split("tuned forward ", 1)[1].split(": ", 1)[-1].split(" (", 1)[0]


def gate_step() -> int:
    import torch

    from fa4tune import flash_attn_varlen_func
    from fa4tune.harness import gate

    failures = 0
    print(f"{'case':52s} {'page':>4s} {'gate (worst error / tolerance)':44s} {'vs contiguous':22s} ran")
    for label, batch, seqlen_q, slots, heads, kv_heads, head_dim, causal, given in GATE_CASES:
        q, k, v = _tensors(batch, seqlen_q, slots, heads, kv_heads, head_dim, seed=batch)
        used = used_lengths(batch, slots, given, seed=slots, low=seqlen_q if causal else 1)
        with torch.no_grad(), DebugLines() as lines:
            contiguous, _ = flash_attn_varlen_func(q, k, v, seqused_k=used, causal=causal)
        contiguous_line = next((line for line in reversed(lines) if "tuned forward" in line), "")
        for page_size in PAGE_SIZES:
            k_pool, table = scatter_pages(k, page_size, seed=page_size)
            v_pool, _ = scatter_pages(v, page_size, seed=page_size)
            with torch.no_grad(), DebugLines() as lines:
                out, lse = flash_attn_varlen_func(q, k_pool, v_pool, page_table=table, seqused_k=used, causal=causal,
                                                  return_lse=True)
            result = gate.check_outputs(q, k_pool, v_pool, causal, out, lse, page_table=table, seqused_k=used)
            line = ran_paged(lines, page_size)
            diff = (out.float() - contiguous.float()).abs().max().item()
            same_config = bool(line) and config_of(line) == config_of(contiguous_line)
            failures += (not result.passed) + (not line) + (same_config and diff != 0)
            worst = max(result.checks, key=lambda c: c.error / c.tolerance if c.tolerance else float("inf"))
            verdict = (f"ok {worst.name} {worst.error:.3g} / {worst.tolerance:.3g}" if result.passed
                       else f"FAILED {result.reason[:160]}")
            equal = f"{'same config' if same_config else 'other config'} {diff:.3g}"
            ran = config_of(line) or f"NOT the paged class: {lines[-1] if lines else 'no tuned forward'}"
            print(f"{label:52s} {page_size:4d} {verdict:44s} {equal:22s} {ran}")
    return failures


def time_step(rounds: int = 20, input_sets: int = 2) -> int:
    import torch
    import torch.nn.functional as F

    from bench.common import geomean
    from fa4tune import flash_attn_varlen_func
    from fa4tune.harness import gate, timing
    from fa4tune.harness.steps import make_flusher

    device = torch.device("cuda")
    flusher, timer = make_flusher(device), timing.CudaEventTimer()
    failures, ratios = 0, {name: [] for name in [f"paged {page}" for page in PAGE_SIZES] + [IN_ORDER, GATHER, BY_HEAD]}
    print(f"{'shape':26s} {'candidate':18s} {'median ms':>10s} {'min':>8s} {'max':>8s} {'vs contiguous':>14s} {'vs SDPA':>8s}")
    for label, batch, slots in TIME_CASES:
        sets = []
        for i in range(input_sets):
            q, k, v = _tensors(batch, 1, slots, HEADS, KV_HEADS, HEAD_DIM, seed=100 + i)
            used = torch.full((batch,), slots, dtype=torch.int32, device="cuda")
            pools = {}  # candidate -> (table, k pool, v pool): K and V cut into the same pages, in the same order
            for page in PAGE_SIZES:
                (k_pool, table), (v_pool, _) = (scatter_pages(t, page, seed=page + i) for t in (k, v))
                pools[f"paged {page}"] = (table, k_pool, v_pool)
            # pages of 16 in the contiguous cache's order: what is left of their cost is the kernel's addressing,
            # not where the pages lie (TLB reach, DRAM rows)
            (k_pool, table), (v_pool, _) = (scatter_pages(t, 16, seed=i, in_order=True) for t in (k, v))
            pools[IN_ORDER] = (table, k_pool, v_pool)
            sets.append((q, k, v, used, pools))

        def call(name, s):
            q, k, v, used, pools = s
            if name == "contiguous":
                return lambda: flash_attn_varlen_func(q, k, v, seqused_k=used, causal=True)[0]
            if name == "sdpa":  # the GPU's own SDPA decode on the contiguous cache, GQA by enable_gqa
                return lambda: F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                              enable_gqa=True).transpose(1, 2)
            table, k_pool, v_pool = pools[name]
            return lambda: flash_attn_varlen_func(q, k_pool, v_pool, page_table=table, seqused_k=used, causal=True)[0]

        def gather(s, name):  # K's and V's 16-token pages copied out in table order: the pool's reads alone
            q, k, v, used, pools = s
            table, k_pool, v_pool = pools["paged 16" if name in (GATHER, BY_HEAD) else IN_ORDER]
            rows = table.flatten().long()
            if name in (BY_HEAD, BY_HEAD_IN_ORDER):
                return lambda: (gather_by_head(k_pool, rows), gather_by_head(v_pool, rows))
            return lambda: (k_pool.index_select(0, rows), v_pool.index_select(0, rows))

        gathers = {name: [gather(s, name) for s in sets] for name in (GATHER, GATHER_IN_ORDER, BY_HEAD, BY_HEAD_IN_ORDER)}
        names = [f"paged {page}" for page in PAGE_SIZES] + [IN_ORDER, "contiguous", "sdpa"]
        calls = {name: [call(name, s) for s in sets] for name in names}
        with torch.no_grad():
            for name in names:  # the gate first, on the first input set: each output against the fp32 reference
                q, k, v, used, pools = sets[0]
                out = calls[name][0]()
                if name.startswith("paged"):
                    table, k_pool, v_pool = pools[name]
                    result = gate.check_outputs(q, k_pool, v_pool, True, out, None, page_table=table, seqused_k=used)
                else:
                    result = gate.check_outputs(q, k, v, True, out, None)
                if not result.passed:
                    failures += 1
                    print(f"{label:26s} {name:18s} gate FAILED: {result.reason[:160]}")
                    del calls[name]
            timings = timing.benchmark(calls, timer=timer, flush=flusher, warmup=3, rounds=rounds, seed=slots)
        medians = {name: t.median_ms for name, t in timings.items()}
        for name, t in timings.items():
            contiguous, sdpa = medians.get("contiguous"), medians.get("sdpa")
            vs_contiguous = f"{t.median_ms / contiguous:.3f}x" if contiguous and name.startswith("paged") else ""
            vs_sdpa = f"{sdpa / t.median_ms:.3f}x" if sdpa and name != "sdpa" else ""
            if name.startswith("paged") and contiguous:
                ratios[name].append(t.median_ms / contiguous)
            print(f"{label:26s} {name:18s} {t.median_ms:10.4f} {t.min_ms:8.4f} {t.max_ms:8.4f} {vs_contiguous:>14s} {vs_sdpa:>8s}")
        # the floor: the same K and V bytes gathered page by page by torch's index kernel (no attention)
        timings = timing.benchmark(gathers, timer=timer, flush=flusher, warmup=3, rounds=rounds, seed=slots + 1)
        ratios[GATHER].append(timings[GATHER].median_ms / timings[GATHER_IN_ORDER].median_ms)
        ratios[BY_HEAD].append(timings[BY_HEAD].median_ms / timings[BY_HEAD_IN_ORDER].median_ms)
        for name, t in timings.items():
            base = GATHER_IN_ORDER if name in (GATHER, GATHER_IN_ORDER) else BY_HEAD_IN_ORDER
            print(f"{label:26s} {name:26s} {t.median_ms:10.4f} {t.min_ms:8.4f} {t.max_ms:8.4f} "
                  f"{t.median_ms / timings[base].median_ms:13.3f}x (vs {base})")
    for name, values in ratios.items():
        if values:
            mean = geomean(values)
            if name in (GATHER, BY_HEAD):
                print(f"{name}: time / in order (the shuffle's floor), geomean over {len(values)} shapes {mean:.3f}")
                continue
            print(f"{name}: time / contiguous, geomean over {len(values)} shapes {mean:.3f} "
                  f"({'within' if max(values) <= WITHIN else 'NOT within'} {WITHIN - 1:.0%} on every shape)")
    print("(SDPA ratio: SDPA's time over the candidate's; above 1: faster than SDPA)")
    return failures


def graphs_step(batch: int = 8, slots: int = 8192) -> int:
    import torch

    from fa4tune import flash_attn_varlen_func
    from fa4tune.harness import gate

    failures = 0
    for page_size in (16, 256):
        q, k, v = _tensors(batch, 1, slots, HEADS, KV_HEADS, HEAD_DIM, seed=0)
        k_pool, table = scatter_pages(k, page_size, seed=1)
        v_pool, _ = scatter_pages(v, page_size, seed=1)
        used = used_lengths(batch, slots, None, seed=2)
        static = (q, k_pool, v_pool, table, used)

        def decode(q, k_pool, v_pool, table, used):
            return flash_attn_varlen_func(q, k_pool, v_pool, page_table=table, seqused_k=used, causal=True)[0]

        with torch.no_grad():
            decode(*static)  # compiles and fills the host's caches outside the capture
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                decode(*static)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                captured = decode(*static)
            for seed in (3, 4):  # new queries, new cache values, new page order, new used lengths, in place
                q2, k2, v2 = _tensors(batch, 1, slots, HEADS, KV_HEADS, HEAD_DIM, seed=seed)
                k_pool2, table2 = scatter_pages(k2, page_size, seed=seed)
                v_pool2, _ = scatter_pages(v2, page_size, seed=seed)
                used2 = used_lengths(batch, slots, None, seed=seed)
                for s, f in zip(static, (q2, k_pool2, v_pool2, table2, used2)):
                    s.copy_(f)
                graph.replay()
                torch.cuda.synchronize()
                eager = decode(q2, k_pool2, v_pool2, table2, used2)
                result = gate.check_outputs(q2, k_pool2, v_pool2, True, captured, None, page_table=table2, seqused_k=used2)
                diff = (captured.float() - eager.float()).abs().max().item()
                failures += (not result.passed) + (diff != 0)
                print(f"paged {page_size} decode b{batch} {slots} slots, replay on new inputs {seed}: gate "
                      f"{'ok' if result.passed else 'FAILED ' + result.reason[:120]}, max |diff| vs eager {diff:.3g}, "
                      f"used {used2.tolist()}")
    return failures


STEPS = {"gate": gate_step, "time": time_step, "graphs": graphs_step}


def main(argv: list[str]) -> int:
    return gpu_script_main(STEPS, argv, echo_calls=False)  # DebugLines reads which config ran each call


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
