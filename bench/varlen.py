"""Packed batches of mixed lengths (varlen) through the tuned kernels: gated per sequence, timed against upstream's
defaults, and against the same tokens padded to equal lengths (issue #42 item 3).

    FLASH_ATTENTION_ARCH=sm_120 FLASH_ATTENTION_NUM_SMS=132 python3 bench/varlen.py [--batches NAME,...] [--rounds 20]

Every batch (suites/varlen.json: packed training batches, a batch of prompts, a DiT's non-causal batch, fp16 and GQA) runs
`attention()` with cu_seqlens: the table's varlen forward for its class (fa4tune.api.DispatchTables.
varlen_forward_config); upstream's is its SM120 default. Both backwards run on our backward class
(kernels/backward_sm120.py), upstream's knobs on it: upstream's own class gets packed GQA dK/dV wrong. Each
sequence's out, LSE (and dQ, dK, dV for a training batch) is checked against the fp32 reference of that sequence
alone, under the gate's rule (fa4tune.harness.gate.check_outputs); a failing sequence fails the batch, naming it.
Then both candidates are timed, in pairs of rounds of opposite order (ABBA; CUDA events, L2 flushed before each call;
each speedup the median of the paired ratios, with its quartiles, since whole runs drifted 10-30 % apart on the H100), on
the packed batch (for a training batch also its forward alone) and on its padded twin: as many sequences, each of
the mean length, as plain (batch, seqlen, heads, head_dim) tensors, so that the table's own entries run. On a GPU
that is not SM 12.0 the SM120 kernels run emulated.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def check_packed(q, k, v, causal, lengths, out, lse, grads=None, dout=None) -> list[str]:
    """The gate's rule per sequence of a packed call (fa4tune.harness.gate.check_outputs with `lengths`): [] when
    every sequence passes, else the first failing sequence's reason, naming it."""
    from fa4tune.harness.gate import check_outputs

    result = check_outputs(q, k, v, causal, out, lse, grads, dout, variant="packed", lengths=tuple(lengths))
    return [] if result.passed else [result.reason]


def paired_speedup(upstream_ms: list[float], table_ms: list[float]) -> tuple[float, float, float]:
    """(median, first quartile, third quartile) of the speedups upstream / table per pair of rounds: the two calls of
    a round ran back to back, so a drift of the GPU's clock or of the host between rounds cancels in each ratio, and
    the calls' order is reversed every other round (_timed), so the geometric mean of two rounds' ratios cancels what
    a call's place in the round does to it (identical configs in the same place of every round read 0.77-0.91x on the
    H100, docs/measurements/2026-12-05-h100-upstream-tests-and-varlen-order.md; reversing a round of six calls still
    read 0.94x on identical configs: 2026-12-05-h100-split-kv-decode-varlen-fp16.md)."""
    ratios = [u / t for u, t in zip(upstream_ms, table_ms)]
    if len(ratios) > 1:
        ratios = [math.sqrt(a * b) for a, b in zip(ratios[0::2], ratios[1::2])]
    ratios.sort()
    q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else (ratios[0],) * 3
    return statistics.median(ratios), q1, q3


def _timed(pairs: dict, rounds: int, clock) -> dict:
    """ms per shape, name and round: each shape's two calls (table, upstream) timed on their own, one shape after the
    other, in the order A B, B A, A B, ... (an ABBA design: over two rounds each call runs once first and once second,
    once after each of the two), so neither a call's place in the round nor the call before it favours one side.
    clock(fn) runs fn once and returns its ms."""
    times = {shape: {name: [] for name in fns} for shape, fns in pairs.items()}
    for shape, fns in pairs.items():
        names = list(fns)
        for name in names[::-1]:  # warm-up (and compile), B A: so that the first two rounds are symmetric as well
            clock(fns[name])
        for round_ in range(rounds):
            for name in (names if round_ % 2 == 0 else names[::-1]):
                times[shape][name].append(clock(fns[name]))
    return times


def cuda_clock(device):
    """A clock for _timed: CUDA events around one call, L2 flushed before it, the device idle after it."""
    import torch

    flush = torch.empty(256 << 20, dtype=torch.uint8, device=device)

    def clock(fn) -> float:
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize(device)
        return start.elapsed_time(end)
    return clock


def run_batch(batch, experiment, rounds: int, device) -> dict:
    """One packed problem of the varlen suite (fa4tune.config.Problem with lengths): gated, then timed."""
    import torch

    from fa4tune import defaults
    from fa4tune.api import attention, problem_class_of
    from fa4tune.harness import gate
    from fa4tune.harness.runtime_guards import attention_trap

    q, k, v = gate.random_inputs(batch, 0, device, count=3)
    packed = gate.packing(batch.lengths, device)
    pc = batch.problem_class
    configs = {"table": (experiment.TABLES.varlen_forward_config(pc), experiment.backward_config(pc)),
               "upstream": (defaults.upstream_forward(pc), defaults.upstream_backward(pc))}
    row = {"batch": batch.label, "class": pc.name, "table_config": configs["table"][0].short(), "failures": {}}
    dout = torch.randn_like(q) if batch.backward else None
    for name, (fwd, bwd) in configs.items():
        qq, kk, vv = (t.detach().requires_grad_(batch.backward) for t in (q, k, v))
        with attention_trap():  # the harness's run-time trap, as around every measured call
            out, lse = attention(qq, kk, vv, batch.causal, fwd_config=fwd, bwd_config=bwd, return_lse=True, tables=experiment.TABLES, **packed)
            grads = torch.autograd.grad(out, (qq, kk, vv), dout) if batch.backward else None
        row["failures"][name] = check_packed(q, k, v, batch.causal, batch.lengths, out.detach(), lse.detach(), grads, dout)

    def call(name, padded=False, grads=batch.backward):
        fwd, bwd = configs[name]
        if padded:  # the same tokens as equal-length sequences: plain tensors, so the class's own entry runs
            n, mean = len(batch.lengths), sum(batch.lengths) // len(batch.lengths)
            args = [t[: n * mean].reshape(n, mean, *t.shape[1:]) for t in (q, k, v)]
            if name == "table":
                own = problem_class_of(*args, batch.causal)
                fwd, bwd = experiment.forward_config(own), experiment.backward_config(own)
            kwargs = {}
        else:
            args, kwargs = [q, k, v], packed
        args = [t.detach().requires_grad_(grads) for t in args]

        def fn():
            out = attention(*args, batch.causal, fwd_config=fwd, bwd_config=bwd, tables=experiment.TABLES, **kwargs)
            if grads:
                torch.autograd.grad(out, args, torch.ones_like(out))
        return fn

    pairs = {shape: {name: call(name, shape == "padded") for name in configs} for shape in ("varlen", "padded")}
    if batch.backward:  # the forward alone as well, to tell which direction a training batch's speedup comes from
        pairs["varlen fwd"] = {name: call(name, grads=False) for name in configs}
    with attention_trap():
        times = _timed(pairs, rounds, cuda_clock(device))
    row["ms"] = {f"{name} {shape}": statistics.median(t) for shape, fns in times.items() for name, t in fns.items()}
    for key, shape in (("speedup_varlen", "varlen"), ("speedup_padded", "padded"), ("speedup_varlen_fwd", "varlen fwd")):
        row[key] = paired_speedup(times[shape]["upstream"], times[shape]["table"]) if shape in times else None
    return row


def _speedup(value) -> str:
    return "-" if value is None else f"{value[0]:.3f} [{value[1]:.3f}-{value[2]:.3f}]"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="varlen", help="a suite of packed problems (suites/varlen.json)")
    parser.add_argument("--batches", default="", help="comma-separated substrings of batch names (default: all)")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args(argv)
    from fa4tune.harness.candidates import load_experiment
    from fa4tune.harness.settings import EXPERIMENT_PATH

    experiment = load_experiment(EXPERIMENT_PATH)  # the static rules and the pin first, as every measuring path
    import torch

    from fa4tune.suites import load_suite

    wanted = [b for b in load_suite(args.suite) if not args.batches or any(s in b.label for s in args.batches.split(","))]
    device = torch.device("cuda")
    print(f"{torch.cuda.get_device_name(device)}: {len(wanted)} packed batches, {args.rounds} rounds", flush=True)
    failed = 0
    print("| batch | class | table's config | gate (table / upstream) | table ms varlen / padded | speedup varlen | "
          "speedup forward alone | speedup padded |  (speedups: median of the rounds' paired ratios [quartiles])")
    print("|---|---|---|---|---|---|---|---|")
    for batch in wanted:
        row = run_batch(batch, experiment, args.rounds, device)
        gate = " / ".join("pass" if not row["failures"][n] else f"FAIL {len(row['failures'][n])}" for n in ("table", "upstream"))
        failed += bool(row["failures"]["table"])
        print(f"| {batch.label} | {row['class']} | {row['table_config']} | {gate} | {row['ms']['table varlen']:.3f} / "
              f"{row['ms']['table padded']:.3f} | {_speedup(row['speedup_varlen'])} | {_speedup(row['speedup_varlen_fwd'])} | "
              f"{_speedup(row['speedup_padded'])} |", flush=True)
        for name, lines in row["failures"].items():
            for line in lines:
                print(f"  {name}: {line}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
