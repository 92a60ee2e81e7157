"""Issue 71's GPU checks of learnable sinks and the deterministic backward through our kernels, one step per argument.

    python3 bench/sinks_gpu.py sinks        # forward and backward with a learnable sink (gpt-oss's attention shapes,
                                            # GQA, causal, its sliding window, a packed batch, a split-KV decode), gated
                                            # against the fp32 reference with the sink (out, LSE, dq, dk, dv, d(sink));
                                            # each timed against the same call without a sink, interleaved
    python3 bench/sinks_gpu.py determinism  # the deterministic backward 5 times on the same inputs: dq, dk, dv (and
                                            # d(sink)) bit-identical across the runs, and gated; the default backward's
                                            # 5 runs counted (they may differ); the two timed against each other
Calls go through fa4tune.torch_op's op bodies with the shipped tables (the debug line of each says which config ran).
Each step ends with a table and a line "<step>: ok" or "<step>: N failed"; exit 1 on a failure.
"""

from __future__ import annotations

import functools
import math
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import gpu_script_main  # noqa: E402

RUNS = 5  # backward runs on the same inputs (determinism)
ROUNDS = 20  # timed rounds, candidates in a shuffled order each (fa4tune.harness.timing.benchmark)
GPT_OSS = "openai/gpt-oss-20b config.json: 64 heads, 8 KV heads, head_dim 64, sliding_window 128 on alternate layers, sinks"


@dataclass(frozen=True)
class Case:
    """One call shape: a padded batch, or a packed one (`lengths`); `window_left` >= 0: a causal sliding window."""

    label: str
    batch: int
    seqlen_q: int
    seqlen_k: int
    heads: int
    heads_kv: int
    head_dim: int
    causal: bool = True
    window_left: int = -1
    lengths: tuple[int, ...] = ()
    backward: bool = True
    sink: bool = True

    @property
    def window(self) -> tuple[int | None, int | None]:
        return (self.window_left, 0) if self.window_left >= 0 else (None, None)


SINK_CASES = [
    Case("gpt-oss full layer", 1, 4096, 4096, 64, 8, 64),
    Case("gpt-oss sliding layer (window 128)", 1, 4096, 4096, 64, 8, 64, window_left=128),
    Case("gpt-oss packed (1000 + 3000 + 96)", 3, 3000, 3000, 64, 8, 64, lengths=(1000, 3000, 96)),
    Case("gpt-oss decode (8 x 1 over 8192 keys)", 8, 1, 8192, 64, 8, 64, backward=False),
    Case("d128 GQA 4 causal", 2, 2048, 2048, 32, 8, 128),
    Case("d128 non-causal", 2, 1024, 1024, 16, 16, 128, causal=False),
]
DETERMINISM_CASES = [
    Case("d128 GQA 4 causal (dQ, dK/dV ordered)", 2, 2048, 2048, 32, 8, 128, sink=False),
    Case("gpt-oss full layer, with its sink", 1, 4096, 4096, 64, 8, 64),
    Case("d128 non-causal (edge class)", 2, 2048, 2048, 16, 16, 128, causal=False, sink=False),
    Case("d96 causal (one Q stage)", 2, 2048, 2048, 16, 16, 96, sink=False),
    Case("d64 causal packed (1000 + 3000 + 96)", 3, 3000, 3000, 16, 16, 64, lengths=(1000, 3000, 96), sink=False),
]


def inputs(case: Case, device="cuda", seed=0):
    """q, k, v, dout (bf16) and the sink (fp32, one logit per query head, or None) of a case."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    if case.lengths:
        total = sum(case.lengths)
        shapes = ((total, case.heads), (total, case.heads_kv), (total, case.heads_kv), (total, case.heads))
    else:
        shapes = ((case.batch, case.seqlen_q, case.heads), (case.batch, case.seqlen_k, case.heads_kv),
                  (case.batch, case.seqlen_k, case.heads_kv), (case.batch, case.seqlen_q, case.heads))
    q, k, v, dout = (torch.randn(*s, case.head_dim, generator=g, device=device).bfloat16() for s in shapes)
    sink = torch.randn(case.heads, generator=g, device=device) * 2 if case.sink else None
    return q, k, v, dout, sink


@functools.lru_cache(maxsize=None)
def _packing(lengths: tuple, device):
    """A packed case's cu_seqlens and max lengths, built once: a host-to-device copy from pageable memory waits for
    the stream, so building them per call would stall every timed call behind the timer's blocking kernel."""
    from fa4tune.harness import gate

    found = gate.packing(lengths, device)
    return (found["cu_seqlens_q"], found["cu_seqlens_k"], found["max_seqlen_q"], found["max_seqlen_k"]) if found else (None,) * 4


def forward(case: Case, q, k, v, sink):
    """(out, lse) of our tuned forward (the op's body)."""
    from fa4tune import torch_op

    cu_q, cu_k, max_q, max_k = _packing(tuple(case.lengths), q.device)
    return torch_op.tuned_forward(q, k, v, cu_q, cu_k, None, None, None, max_q, max_k, None, case.causal, *case.window, 0.0,
                                  1, None, True, sink)


def backward(case: Case, q, k, v, out, lse, dout, sink, deterministic=False):
    """(dq, dk, dv, dsink) of our tuned backward (the op's body; dsink empty without a sink)."""
    from fa4tune import torch_op

    cu_q, cu_k, max_q, max_k = _packing(tuple(case.lengths), q.device)
    return torch_op.tuned_backward(dout, q, k, v, out, lse, None, cu_q, cu_k, None, None, max_q, max_k, None, case.causal,
                                   *case.window, 0.0, sink, deterministic)


def references(case: Case, q, k, v, sink, dout=None):
    """(fp32 reference, plain bf16 reference) with the sink, each as one AttentionReference in the kernel's layouts
    (a packed batch: each sequence alone, concatenated; its LSE (heads, total); d(sink) summed over the sequences)."""
    import torch

    from fa4tune.harness import gate

    window = tuple(-1 if side is None else side for side in case.window)

    def one(dtype):
        if not case.lengths:
            return gate.reference_attention(q, k, v, case.causal, dtype=dtype, dout=dout, window_size=window,
                                            learnable_sink=sink)
        parts, start = [], 0
        for n in case.lengths:
            s = slice(start, start + n)
            parts.append(gate.reference_attention(q[None, s], k[None, s], v[None, s], case.causal, dtype=dtype,
                                                  dout=None if dout is None else dout[None, s], window_size=window,
                                                  learnable_sink=sink))
            start += n
        cat = lambda name, dim: None if getattr(parts[0], name) is None else torch.cat([getattr(p, name)[0] for p in parts], dim)  # noqa: E731
        dsink = None if parts[0].dsink is None else sum(p.dsink for p in parts)
        return gate.AttentionReference(cat("out", 0), cat("lse", 1), cat("dq", 0), cat("dk", 0), cat("dv", 0),
                                       None, dsink)

    return one(torch.float32), one(torch.bfloat16)


def checks(ref, plain, out=None, lse=None, grads=None) -> list:
    """The gate's pass rule (fa4tune.harness.gate.compare) on what was given: out and LSE, and/or (dq, dk, dv, dsink)."""
    import torch

    from fa4tune.harness import gate

    found = []
    if out is not None:
        found += [gate.compare("out", out, ref.out, plain.out, torch.bfloat16),
                  gate.compare("lse", lse, ref.lse, plain.lse, torch.bfloat16)]
    if grads is not None:
        dq, dk, dv, dsink = grads
        found += [gate.compare(name, value, getattr(ref, name), getattr(plain, name), torch.bfloat16)
                  for name, value in (("dq", dq), ("dk", dk), ("dv", dv))]
        if ref.dsink is not None:
            found.append(gate.compare("dsink", dsink, ref.dsink, plain.dsink, torch.bfloat16))
    return found


def verdict(found: list) -> str:
    """'ok', or the first failing check's reason."""
    failing = [c.describe() for c in found if not c.passed]
    return failing[0] if failing else "ok"


def time_against(candidates: dict, rounds: int = ROUNDS) -> dict:
    """Median milliseconds of each candidate (name -> call), interleaved in shuffled rounds behind a blocking kernel,
    the L2 flushed before each call (the harness's timer)."""
    import torch

    from fa4tune.harness.steps import make_flusher
    from fa4tune.harness.timing import CudaEventTimer, benchmark

    from fa4tune.harness.timing import TimingError

    try:
        timed = benchmark({name: [call] for name, call in candidates.items()}, timer=CudaEventTimer(),
                          flush=make_flusher(torch.device("cuda")), rounds=rounds)
    except TimingError as err:  # e.g. a call that waits for the device: its checks above stand, its time is not taken
        print(f"not timed: {str(err).split(';')[0]}", flush=True)
        for name, call in candidates.items():  # where each call waits for the device: torch names the first sync
            torch.cuda.set_sync_debug_mode("error")
            try:
                call()
                print(f"  {name}: no synchronizing torch call (the wait is elsewhere: the host path's own time?)")
            except RuntimeError as sync:
                import traceback

                frames = [f for f in traceback.extract_tb(sync.__traceback__) if "/torch/" not in f.filename][-3:]
                print(f"  {name}: {str(sync).splitlines()[0]} at " + " <- ".join(f"{f.filename}:{f.lineno}" for f in frames[::-1]))
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return {name: math.nan for name in candidates}
    return {name: t.median_ms for name, t in timed.items()}


def distinct(results: list[tuple]) -> int:
    """How many different results (tuples of tensors, compared bit for bit) a list of runs holds."""
    import torch

    kinds: list[tuple] = []
    for result in results:
        if not any(all(torch.equal(a, b) for a, b in zip(result, kind)) for kind in kinds):
            kinds.append(result)
    return len(kinds)


def print_table(header: list[str], rows: list[list[str]]) -> None:
    """A plain-text table, columns as wide as their widest cell."""
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, ["-" * w for w in widths], *rows]:
        print("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip())


class _Said:
    """While open, the "fa4tune" logger's debug lines (which config ran a call, and why) print; timed calls stay quiet."""

    def __enter__(self):
        import logging

        logging.getLogger("fa4tune").setLevel(logging.DEBUG)

    def __exit__(self, *exc):
        import logging

        logging.getLogger("fa4tune").setLevel(logging.INFO)


def sinks_step() -> int:
    import torch

    failures, rows = 0, []
    for case in SINK_CASES:
        q, k, v, dout, sink = inputs(case)
        with _Said():
            out, lse = forward(case, q, k, v, sink)
        ref, plain = references(case, q, k, v, sink, dout if case.backward else None)
        found = checks(ref, plain, out, lse)
        print(f"{case.label} forward: {verdict(found)}", flush=True)
        fwd_ms = time_against({"no sink": lambda: forward(case, q, k, v, None), "sink": lambda: forward(case, q, k, v, sink)})
        row = [case.label, verdict(found), f"{fwd_ms['no sink']:.3f}", f"{fwd_ms['sink']:.3f}",
               f"{fwd_ms['sink'] / fwd_ms['no sink']:.3f}"]
        if case.backward:
            with _Said():
                grads = backward(case, q, k, v, out, lse, dout, sink)
            bwd_found = checks(ref, plain, grads=grads)
            found += bwd_found
            out0, lse0 = forward(case, q, k, v, None)
            bwd_ms = time_against({"no sink": lambda: backward(case, q, k, v, out0, lse0, dout, None),
                                   "sink": lambda: backward(case, q, k, v, out, lse, dout, sink)})
            row += [verdict(bwd_found), f"{bwd_ms['no sink']:.3f}", f"{bwd_ms['sink']:.3f}",
                    f"{bwd_ms['sink'] / bwd_ms['no sink']:.3f}"]
        else:
            row += ["(forward only)", "", "", ""]
        failures += any(not c.passed for c in found)
        rows.append(row)
        print(f"{case.label}: " + "; ".join(f"{c.name} err {c.error:.3g} (tol {c.tolerance:.3g})" for c in found), flush=True)
        q = k = v = dout = out = lse = None  # freed before the next case (the timed lambdas are done with them)
        torch.cuda.empty_cache()
    print_table(["case", "forward gate", "fwd ms no sink", "fwd ms sink", "ratio", "backward gate", "bwd ms no sink",
                 "bwd ms sink", "ratio"], rows)
    return failures


def determinism_step() -> int:
    import torch

    failures, rows = 0, []
    for case in DETERMINISM_CASES:
        q, k, v, dout, sink = inputs(case)
        out, lse = forward(case, q, k, v, sink)
        with _Said():
            backward(case, q, k, v, out, lse, dout, sink, True)
        ordered = [tuple(t.clone() for t in backward(case, q, k, v, out, lse, dout, sink, True)) for _ in range(RUNS)]
        default = [tuple(t.clone() for t in backward(case, q, k, v, out, lse, dout, sink)) for _ in range(RUNS)]
        same = distinct(ordered) == 1
        ref, plain = references(case, q, k, v, sink, dout)
        found = checks(ref, plain, grads=ordered[0])
        print(f"{case.label}: {RUNS} deterministic runs bit-identical: {same} ({distinct(ordered)} distinct); default: "
              f"{distinct(default)} distinct of {RUNS}; gate: {verdict(found)}", flush=True)
        ms = time_against({"default": lambda: backward(case, q, k, v, out, lse, dout, sink),
                           "deterministic": lambda: backward(case, q, k, v, out, lse, dout, sink, True)})
        failures += (not same) or any(not c.passed for c in found)
        rows.append([case.label, "yes" if same else f"NO: {distinct(ordered)} different", f"{distinct(default)} of {RUNS}",
                     verdict(found), f"{ms['default']:.3f}", f"{ms['deterministic']:.3f}",
                     f"{ms['deterministic'] / ms['default']:.3f}"])
        del ordered, default
        torch.cuda.empty_cache()
    print_table(["case", f"deterministic: {RUNS} runs bit-identical", "default: distinct results", "gate (deterministic)",
                 "ms default", "ms deterministic", "ratio"], rows)
    return failures


STEPS = {"sinks": sinks_step, "determinism": determinism_step}


def main(argv: list[str]) -> int:
    return gpu_script_main(STEPS, argv, debug=False)  # debug lines around the gated calls only (_Said), none timed


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
