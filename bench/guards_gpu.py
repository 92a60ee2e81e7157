"""The guardrails on a real GPU: an honest kernel and experiment.attention pass them, a side-stream cheat is caught,
what the guards cost per (problem, direction) next to the gate, and issue 41's and 66's planted cheats (correct then
garbage, cached or memoized outputs, gradients not computed or never written, a new stream, a harness patch, a wrong
x8 answer, q zeroed in place, os.urandom or the clock replaced, one output buffer) are each caught by measure_step as
a step child runs it, with the rule its reason must name (a line each: caught / NOT CAUGHT).

    FLASH_ATTENTION_ARCH=sm_120 FLASH_ATTENTION_NUM_SMS=<SMs> python3 bench/guards_gpu.py

Not a test (CI has no GPU): a script that prints a table; the CPU tests (tests/test_guards.py) use a fake stream.
"""

import logging
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from fa4tune.config import Problem  # noqa: E402
from fa4tune.harness import candidates, guards, runtime_guards, steps  # noqa: E402
from fa4tune.harness.settings import EXPERIMENT_PATH, Settings  # noqa: E402

SETTINGS = Settings(gate_seed=1234)
PROBLEMS = [
    Problem(1, 2048, 2048, 32, 8, 128, 128, True, name="gqa causal 2k"),
    Problem(2, 1024, 1024, 16, 16, 64, 64, False, name="d64 1k"),
    Problem(1, 1, 4096, 32, 8, 128, 128, False, backward=False, name="decode 4k"),
]


def einsum_attention(q, k, v, causal):
    """Plain torch math (fp32 scores): an honest, slow kernel."""
    group = q.shape[2] // k.shape[2]
    kk, vv = k.repeat_interleave(group, dim=2).float(), v.repeat_interleave(group, dim=2).float()
    scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), kk) / math.sqrt(q.shape[-1])
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        mask = torch.arange(sk, device=q.device)[None, :] > torch.arange(sq, device=q.device)[:, None] + (sk - sq)
        scores = scores.masked_fill(mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    return torch.einsum("bhqk,bkhd->bqhd", torch.softmax(scores, dim=-1), vv).to(q.dtype), lse


SIDE = None


def side_stream_attention(q, k, v, causal):
    """Runs on a stream made before the trap, switched to behind torch.cuda.set_stream's back, and returns
    without making the caller's stream wait: only the readiness check can see it."""
    current = torch.cuda.current_stream()
    SIDE.wait_stream(current)
    torch._C._cuda_setStream(stream_id=SIDE.stream_id, device_index=SIDE.device_index, device_type=SIDE.device_type)
    try:
        out, lse = einsum_attention(q, k, v, causal)
    finally:
        torch._C._cuda_setStream(stream_id=current.stream_id, device_index=current.device_index, device_type=current.device_type)
    return out, lse


def verdict(forward, problem, direction) -> tuple[str, float]:
    """('pass' or the violation, seconds) of the run-time guards alone, under the trap."""
    start = time.perf_counter()
    try:
        with runtime_guards.attention_trap():
            runtime_guards.check_candidate(forward, problem, direction, "cuda", seed=99)
        result = "pass"
    except guards.GuardViolation as err:
        result = str(err).split(" (")[0]
    torch.cuda.synchronize()
    return result, time.perf_counter() - start


# ------------------------------------------------------------------------------------------------
# Issue 41: cheats that pass the gate and the guards' first calls, then cheat while timed (tests/test_planted_cheats.py
# plants the same on the CPU; tests/test_bench_guards_gpu.py runs these on the CPU too). Each is made from an honest
# forward and `turn`, the forward calls it answers honestly (the gate's, the guards', the warm-up's).
# ------------------------------------------------------------------------------------------------


class ZeroGrad(torch.autograd.Function):
    """Identity forward; a backward that does no work."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return torch.zeros_like(grad)


class NeverWritten(torch.autograd.Function):
    """Identity forward; gradients that are never written (torch.empty: the gate's allocator hands out NaN)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return torch.empty_like(grad) if grad.is_cuda else torch.full_like(grad, float("nan"))


def after_calls(turn, honest, cheat):
    """`honest` for the first `turn` calls, `cheat` from then on."""
    seen = [0]

    def forward(q, k, v, causal):
        seen[0] += 1
        return cheat(q, k, v, causal) if seen[0] > turn else honest(q, k, v, causal)
    return forward


def garbage_after(honest, turn):
    return after_calls(turn, honest, lambda q, k, v, c: (torch.zeros_like(honest(q, k, v, c)[0]), honest(q, k, v, c)[1]))


def cached_from_the_gate(honest, turn):
    cache, seen = {}, [0]

    def forward(q, k, v, causal):
        seen[0] += 1
        if seen[0] > turn and q.shape in cache:
            return cache[q.shape]  # the gate's output of this shape, for other inputs
        result = honest(q, k, v, causal)
        cache.setdefault(q.shape, result)
        return result
    return forward


def memo_by_pointer(honest, turn):
    memo, seen = {}, [0]

    def forward(q, k, v, causal):
        seen[0] += 1
        key = (q.data_ptr(), k.data_ptr(), v.data_ptr())
        if seen[0] > turn and key in memo:
            return memo[key]
        memo[key] = honest(q, k, v, causal)
        return memo[key]
    return forward


def zero_gradients_after(honest, turn):
    return after_calls(turn, honest, lambda q, k, v, c: (lambda o: (ZeroGrad.apply(o[0]), o[1]))(honest(q, k, v, c)))


def unwritten_gradients_after(honest, turn):
    return after_calls(turn, honest, lambda q, k, v, c: (lambda o: (NeverWritten.apply(o[0]), o[1]))(honest(q, k, v, c)))


def stream_after(honest, turn):
    def cheat(q, k, v, causal):
        try:
            torch.cuda.Stream()  # the trap, kept set while timing, records it even swallowed
        except Exception:
            pass
        return honest(q, k, v, causal)
    return after_calls(turn, honest, cheat)


def patches_the_harness_after(honest, turn):
    from fa4tune.harness import gate

    original = gate.check_outputs

    def cheat(q, k, v, causal):
        gate.check_outputs = lambda *a, **kw: original(*a, **kw)  # a check that could be told to pass
        return honest(q, k, v, causal)
    return after_calls(turn, honest, cheat)


def thread_after(honest, turn):
    """Returns zeros at once and fills them from a thread 0.2 s later: done "after" the clock stopped."""
    import threading

    def cheat(q, k, v, causal):
        out, lse = honest(q, k, v, causal)
        result = torch.zeros_like(out)  # no synchronize in the call: that alone makes the timer refuse the round
        threading.Timer(0.2, lambda: result.copy_(out)).start()
        return result, lse
    return after_calls(turn, honest, cheat)


def memo_by_tensor_object(honest, turn=0, from_call=3):
    """Issue 66, class 1: the output per (q, k, v) tensor object; from the `from_call`-th call on the same tensors, that one."""
    memo = {}

    def cheat(q, k, v, causal, **packed):
        entry = memo.get((id(q), id(k), id(v)))
        if entry is None or entry[0] is not q:
            entry = memo[(id(q), id(k), id(v))] = [q, 0, None]  # (holding q keeps its id from being reused)
        entry[1] += 1
        if entry[1] < from_call or entry[2] is None:
            entry[2] = honest(q, k, v, causal, **packed)
        return entry[2]

    return cheat


def zeroing_q(honest, turn=0):
    """Issue 66, class 3: q zeroed in place from call `turn` + 1 on, then attention of what is left (a mean of v)."""
    def cheat(q, k, v, causal):
        q.data.zero_()
        return honest(q, k, v, causal)
    return after_calls(turn, honest, cheat)


def replacing(owner, name, replacement):
    """Issue 66, classes 4 and 5: a factory of a cheat that sets owner.name = replacement once, after `turn` calls."""
    def factory(honest, turn):
        def cheat(q, k, v, causal):
            setattr(owner, name, replacement)
            return honest(q, k, v, causal)
        return after_calls(turn, honest, cheat)
    return factory


def one_output_buffer(honest, turn):
    """Every output written into one buffer: a later call overwrites what an earlier one returned."""
    buffer = {}

    def cheat(q, k, v, causal):
        out, lse = honest(q, k, v, causal)
        return buffer.setdefault("out", torch.empty_like(out)).copy_(out), lse
    return after_calls(turn, honest, cheat)


def off_at_x8(honest, turn):
    def forward(q, k, v, causal):
        out, lse = honest(q, k, v, causal)
        return ((out.float() * 1.05).to(out.dtype) if q.abs().max() > 12 else out), lse
    return forward


# (name, direction, factory, the status and the text of the reason that count as caught)
CHEATS = [
    ("garbage after the gate", "fwd", garbage_after, ("incorrect", "timed call")),
    ("cached from the gate", "fwd", cached_from_the_gate, ("guard", "output_reuse")),
    ("memo by data_ptr", "fwd", memo_by_pointer, ("guard", "output_reuse")),
    ("zero gradients", "bwd", zero_gradients_after, ("incorrect", "dq")),
    ("unwritten gradients", "bwd", unwritten_gradients_after, ("incorrect", "NaN")),
    ("new stream", "fwd", stream_after, ("guard", "side_stream")),
    ("work deferred to a thread", "fwd", thread_after, ("guard", "deferred_work")),
    ("patches the harness", "fwd", patches_the_harness_after, ("guard", "harness_access")),
    ("out x1.05 at x8", "fwd", off_at_x8, ("incorrect", "scaled x8")),
    ("memo by tensor object", "fwd", memo_by_tensor_object, ("guard", "output_reuse")),
    ("q zeroed in place", "fwd", zeroing_q, ("guard", "input_write")),
    ("os.urandom replaced", "fwd", replacing(os, "urandom", lambda n: bytes(n)), ("guard", "os.urandom")),
    ("clock stopped (logging.time)", "fwd", replacing(logging.time, "perf_counter", lambda: 0.0), ("guard", "time.perf_counter")),
    ("one output buffer", "fwd", one_output_buffer, ("guard", "output_reuse")),
]


def calls_before_timing(honest, problem, direction, device, settings) -> int:
    """The forward calls an honest guarded candidate answers before its first timed call (backward: before the
    forwards of the timed input sets)."""
    count = [0]

    def counting(q, k, v, causal):
        count[0] += 1
        return honest(q, k, v, causal)

    results = steps.measure_step(problem, direction, [candidates.Candidate("count", counting, {}, guarded=True)], device=device, settings=settings)
    assert results["count"].status == "ok", results["count"]
    after = [0]

    def counting_after(q, k, v, causal):
        after[0] += 1
        return honest(q, k, v, causal)

    runtime_guards.check_candidate(counting_after, problem, direction, device, 0)
    timed = settings.rounds * settings.input_sets  # (the backward: each round's new graph, made off the clock)
    return count[0] - timed - after[0] - (settings.input_sets if direction == "bwd" else 0)


def planted_cheats(honest, problem, device, settings) -> list[tuple[str, str, str, str, bool]]:
    """(cheat, direction, status, reason, caught) of each planted cheat, measured as a step child does
    (steps.measure_step: the gate, the guards, timing, the timed outputs' check, the guards again)."""
    from fa4tune.harness import gate

    rows, turns = [], {}
    for name, direction, factory, (status, text) in CHEATS:
        if direction == "bwd" and not problem.backward:
            continue
        if direction not in turns:
            turns[direction] = calls_before_timing(honest, problem, direction, device, settings)
        originals = gate.check_outputs, os.urandom, logging.time.perf_counter
        try:
            cheat = candidates.Candidate(name, factory(honest, turns[direction]), {}, guarded=True)
            result = steps.measure_step(problem, direction, [cheat], device=device, settings=settings)[name]
        finally:
            gate.check_outputs, os.urandom, logging.time.perf_counter = originals
        rows.append((name, direction, result.status, result.reason, result.status == status and text in result.reason))
    return rows


def main() -> int:
    global SIDE
    SIDE = torch.cuda.Stream()
    experiment = candidates.load_experiment(EXPERIMENT_PATH)
    print(f"device: {torch.cuda.get_device_name()}; SM120 kernels emulated unless this is an SM120 GPU")
    print(f"{'problem':<16} {'dir':<4} {'candidate':<20} {'gate s':>7} {'guards s':>9}  verdict")
    surprises = 0
    for problem in PROBLEMS:
        pc = problem.problem_class
        real = candidates.experiment_candidate(experiment, experiment.forward_config(pc), experiment.backward_config(pc))
        for direction in ("fwd", "bwd") if problem.backward else ("fwd",):
            start = time.perf_counter()
            passed, _, reason = steps._gate_cases(real, problem, direction, "cuda", SETTINGS)  # compiles, then the gate alone
            gate_s = time.perf_counter() - start
            result, guard_s = verdict(real.forward, problem, direction) if passed else (f"gate failed: {reason}", 0.0)
            surprises += result != "pass"
            print(f"{problem.name:<16} {direction:<4} {'experiment.attention':<20} {gate_s:7.2f} {guard_s:9.2f}  {result}")
        if problem.seqlen_q > 1:
            for name, forward, expected in (("einsum (honest)", einsum_attention, "pass"),
                                            ("side stream (cheat)", side_stream_attention, "guard not_ready")):
                result, guard_s = verdict(forward, problem, "fwd")
                surprises += not result.startswith(expected)
                print(f"{problem.name:<16} {'fwd':<4} {name:<20} {'':>7} {guard_s:9.2f}  {result}")
    print(f"{'problem':<16} {'dir':<4} {'planted cheat (issue 41)':<26} {'status':<10} reason")
    for problem in PROBLEMS[:2]:
        for name, direction, status, reason, caught in planted_cheats(einsum_attention, problem, "cuda", Settings(gate_seed=1234, rounds=3)):
            surprises += not caught
            print(f"{problem.name:<16} {direction:<4} {name:<26} {status:<10} {'caught' if caught else 'NOT CAUGHT'}: {reason[:140]}")
    print(f"guards_gpu: {'ok' if not surprises else f'{surprises} unexpected'}")
    return 0 if not surprises else 1


if __name__ == "__main__":
    sys.exit(main())
