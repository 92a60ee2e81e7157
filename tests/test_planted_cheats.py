"""Issue 41: planted cheats that pass the gate and the run-time guards' first calls, then cheat while timed; the
harness catches each (CPU tensors, fakes: fa4tune.harness.steps.measure_step as a step child runs it).

Each cheat counts its calls and turns after the calls the gate, the guards and the warm-up make (`calls_before_timing`),
so only what the harness does while timing or after it can catch it: the check of the timed calls' outputs
(timing.benchmark's `check`), the run-time trap kept set while timing, and the run-time guards run again after it.
"""

import threading

import pytest
import torch

from fa4tune.config import Problem
from fa4tune.harness import candidates, gate, guards, runtime_guards, steps
from fa4tune.harness import settings as settings_module
from fa4tune.harness.settings import Settings
from prepare_child_targets import torch_attention
from bench.guards_gpu import NeverWritten, ZeroGrad, after_calls, memo_by_pointer, memo_by_tensor_object, zeroing_q

torch.set_num_threads(1)

SETTINGS = Settings(gate_seed=11, warmup=1, rounds=3, input_sets=2, gate_random_problems=1)
PROBLEM = Problem(1, 48, 48, 2, 2, 32, 32, True, name="tiny causal")


def honest(q, k, v, causal):
    return torch_attention(q, k, v, causal, return_lse=True)


def guarded(forward, name="planted"):
    return candidates.Candidate(name, forward, {}, guarded=True)


def calls_before_timing(direction: str) -> int:
    """Forward calls an honest guarded candidate gets before its first timed round: the gate's cases, the run-time
    guards' calls, and (for the backward) the forward of each timed input set, which the warm-up differentiates."""
    count = [0]

    def counting(q, k, v, causal):
        count[0] += 1
        return honest(q, k, v, causal)

    results = steps.measure_step(PROBLEM, direction, [guarded(counting)], device="cpu", settings=SETTINGS)
    assert results["planted"].status == "ok", results["planted"]
    timed = SETTINGS.rounds * SETTINGS.input_sets  # (the backward: each round's new graph, made off the clock)
    return count[0] - timed - _guard_calls_after_timing(direction)


def _guard_calls_after_timing(direction: str) -> int:
    count = [0]

    def counting(q, k, v, causal):
        count[0] += 1
        return honest(q, k, v, causal)

    runtime_guards.check_candidate(counting, PROBLEM, direction, "cpu", 0)
    return count[0]


def _first_round(reason: str) -> bool:
    """The reason names a timed call of the first round (the checks after it: one drawn at random and the last)."""
    return reason.startswith("timed call ") and int(reason.split()[2]) < SETTINGS.input_sets


def measure(forward, direction="fwd", others=()):
    return steps.measure_step(PROBLEM, direction, [guarded(forward), *others], device="cpu", settings=SETTINGS)


# ------------------------------------------------------------------------------------------------
# Correct, then garbage: the timed calls' outputs are checked after the clock stops.
# ------------------------------------------------------------------------------------------------


def test_correct_then_garbage_after_n_calls_is_incorrect_with_the_timed_call_index():
    turn = calls_before_timing("fwd")
    seen = [0]

    def forward(q, k, v, causal):
        seen[0] += 1
        out, lse = honest(q, k, v, causal)
        return (torch.zeros_like(out), lse) if seen[0] > turn else (out, lse)

    results = measure(forward, others=[candidates.Candidate("honest", honest, {})])
    planted = results["planted"]
    assert planted.status == "incorrect", planted
    assert _first_round(planted.reason) and "checked after timing" in planted.reason and "out " in planted.reason
    assert results["honest"].status == "ok"  # the honest one beside it is timed and checked too, and passes


def test_garbage_only_in_the_last_timed_call_is_caught_by_the_last_calls_check():
    last = SETTINGS.input_sets * SETTINGS.rounds - 1
    turn = calls_before_timing("fwd") + last  # right for every timed call but the last
    seen = [0]

    def forward(q, k, v, causal):
        seen[0] += 1
        out, lse = honest(q, k, v, causal)
        return (out, lse + 1.0) if seen[0] == turn + 1 else (out, lse)

    planted = measure(forward)["planted"]
    assert planted.status == "incorrect" and "lse " in planted.reason, planted
    assert planted.reason.startswith(f"timed call {last} "), planted.reason


def test_correct_then_zero_gradients_is_incorrect():
    turn = calls_before_timing("bwd")
    seen = [0]

    def forward(q, k, v, causal):
        seen[0] += 1
        out, lse = honest(q, k, v, causal)
        if seen[0] > turn - SETTINGS.input_sets:  # the forwards whose graphs the timed backward calls differentiate
            out = ZeroGrad.apply(out)
        return out, lse

    planted = measure(forward, "bwd")["planted"]
    assert planted.status == "incorrect" and _first_round(planted.reason) and "dq " in planted.reason, planted


def test_gradients_never_written_fail_the_gate():
    passed, _, reason = steps.gate_candidate(guarded(lambda q, k, v, c: (NeverWritten.apply(honest(q, k, v, c)[0]), None)),
                                             PROBLEM, "bwd", "cpu", SETTINGS)
    assert not passed and "dq: " in reason and "NaN" in reason


def test_gradients_never_written_after_the_gate_are_incorrect():
    turn = calls_before_timing("bwd")
    seen = [0]

    def forward(q, k, v, causal):
        seen[0] += 1
        out, lse = honest(q, k, v, causal)
        return (NeverWritten.apply(out) if seen[0] > turn - SETTINGS.input_sets else out), lse

    planted = measure(forward, "bwd")["planted"]
    assert planted.status == "incorrect" and "NaN" in planted.reason, planted


# ------------------------------------------------------------------------------------------------
# Caching: outputs of the gate's inputs, or memoized by the tensors' identity once the guards have run.
# ------------------------------------------------------------------------------------------------


def test_outputs_cached_from_the_gates_inputs_are_output_reuse():
    turn = calls_before_timing("fwd")
    seen, cache = [0], {}

    def forward(q, k, v, causal):
        seen[0] += 1
        if seen[0] > turn and q.shape in cache:
            return cache[q.shape]  # the gate's first output of this shape, for other inputs
        result = honest(q, k, v, causal)
        cache.setdefault(q.shape, result)
        return result

    planted = measure(forward)["planted"]
    # one tensor returned for two input sets of the round: the memory of another call's output
    assert planted.status == "guard" and _first_round(planted.reason) and "output_reuse" in planted.reason, planted
    assert "shares memory with the out of call" in planted.reason, planted.reason


def test_memoizing_by_tensor_identity_after_the_guards_is_caught_in_the_first_timed_round():
    # each input set's own output from the warm-up, no work: the sets are rewritten in place before every round
    planted = measure(memo_by_pointer(honest, calls_before_timing("fwd")))["planted"]
    assert planted.status == "guard" and _first_round(planted.reason) and "output_reuse" in planted.reason, planted
    assert "follow the values input set" in planted.reason, planted.reason


# ------------------------------------------------------------------------------------------------
# Deferred work: another thread, another stream; patching the harness while timed.
# ------------------------------------------------------------------------------------------------


def test_work_deferred_to_a_thread_while_timed_is_deferred_work():
    turn = calls_before_timing("fwd")
    seen, timers = [0], []

    def forward(q, k, v, causal):
        seen[0] += 1
        out, lse = honest(q, k, v, causal)
        if seen[0] <= turn:
            return out, lse
        result = torch.zeros_like(out)
        timer = threading.Timer(5.0, lambda: result.copy_(out))  # "finished later", off the timed window
        timer.start()
        timers.append(timer)
        return result, lse

    try:
        planted = measure(forward)["planted"]
    finally:
        for timer in timers:
            timer.cancel()
    # the timed call that started it is named, and the rule: not a wrong output that a slower machine could let through
    assert planted.status == "guard" and planted.reason.startswith("timed call 0 ") and "deferred_work" in planted.reason, planted


def test_a_stream_made_while_timed_is_caught_by_the_trap_kept_set():
    turn = calls_before_timing("fwd")
    seen = [0]

    def forward(q, k, v, causal):
        seen[0] += 1
        if seen[0] > turn:
            try:
                torch.cuda.Stream()  # the trap records it, even swallowed
            except Exception:
                pass
        return honest(q, k, v, causal)

    planted = measure(forward)["planted"]
    assert planted.status == "guard" and "side_stream" in planted.reason, planted


def test_patching_the_harness_while_timed_is_caught(monkeypatch):
    monkeypatch.setattr(gate, "check_outputs", gate.check_outputs)  # put back after the test
    turn = calls_before_timing("fwd")
    seen = [0]
    original = gate.check_outputs

    def forward(q, k, v, causal):
        seen[0] += 1
        if seen[0] == turn + 1:
            gate.check_outputs = lambda *a, **k: original(*a, **k)  # a check that could be told to pass
        return honest(q, k, v, causal)

    planted = measure(forward)["planted"]
    assert planted.status == "guard" and "harness_access" in planted.reason and "check_outputs" in planted.reason, planted


# ------------------------------------------------------------------------------------------------
# Before any code runs: a kernels/ class that patches the harness at import, a config that reads the gate seed.
# ------------------------------------------------------------------------------------------------


PATCHES_AT_IMPORT = """
from fa4tune.harness import gate
gate.compare = lambda *args, **kwargs: None
class PatchingForwardSm120:
    pass
"""
READS_THE_GATE_SEED = """
import os
from pathlib import Path
Path(__file__).with_name("ran").write_text("experiment.py's code ran")
SEED = int(os.environ.get("FA4TUNE_GATE_SEED", "0"))
FORWARD_DISPATCH = {"d128": {"tile_m": 128 if SEED % 2 else 64}}
"""


def test_a_kernel_class_that_patches_the_harness_at_import_is_refused_before_it_runs(tmp_path, monkeypatch):
    kernel = tmp_path / "kernels" / "patching_forward_sm120.py"
    kernel.parent.mkdir()
    kernel.write_text(PATCHES_AT_IMPORT)
    experiment = tmp_path / "experiment.py"
    experiment.write_text("x = 1\n")
    monkeypatch.setattr(guards, "kernel_sources", lambda root=None: [kernel])
    with pytest.raises(guards.Refused) as refused:
        candidates.load_experiment(experiment)
    assert any(line.startswith("guard harness_access: kernels/patching_forward_sm120.py:2") for line in refused.value.lines), refused.value.lines


def test_a_config_that_reads_the_gate_seed_is_refused_before_its_code_runs(tmp_path):
    experiment = tmp_path / "experiment.py"
    experiment.write_text(READS_THE_GATE_SEED)
    with pytest.raises(guards.Refused) as refused:
        candidates.load_experiment(experiment)
    assert any("guard harness_access" in line and "os.environ" in line for line in refused.value.lines), refused.value.lines
    assert not (tmp_path / "ran").exists()  # refused before any of its code ran


def test_the_harness_reads_the_seed_from_settings_not_from_the_candidate(monkeypatch):
    # the gate's cases are those of settings.gate_seed (the record says which), whatever the candidate does; the seed
    # itself comes from $FA4TUNE_GATE_SEED or is drawn per run, never from anything experiment.py can set
    shapes = []

    def recording(q, k, v, causal):
        shapes.append(tuple(q.shape))
        return honest(q, k, v, causal)

    for seed in (11, 12):
        settings = Settings(gate_seed=seed, warmup=1, rounds=1, input_sets=1, gate_random_problems=1)
        shapes.clear()
        passed, errors, _ = steps.gate_candidate(guarded(recording), PROBLEM, "fwd", "cpu", settings)
        cases = gate.gate_cases(PROBLEM, seed, random_count=1)
        assert passed and errors["gate_seed"] == seed
        assert shapes[:len(cases)] == [(c.problem.batch, c.problem.seqlen_q, c.problem.num_heads, c.problem.head_dim) for c in cases]
    monkeypatch.setenv("FA4TUNE_GATE_SEED", "77")
    assert settings_module.new_gate_seed() == 77
    monkeypatch.delenv("FA4TUNE_GATE_SEED")
    assert len({settings_module.new_gate_seed() for _ in range(4)}) > 1  # drawn, not fixed


# ------------------------------------------------------------------------------------------------
# The x8 case: a slightly wrong answer fails (the relative rule), an honest one passes.
# ------------------------------------------------------------------------------------------------


def _off_at_large_inputs(factor):
    def forward(q, k, v, causal):
        out, lse = honest(q, k, v, causal)
        if q.abs().max() > 12:  # only the x8 case's inputs are this large
            out = (out.float() * factor).to(out.dtype)
        return out, lse
    return forward


def test_out_scaled_by_1_05_at_x8_fails_the_gate():
    passed, _, reason = steps.gate_candidate(guarded(_off_at_large_inputs(1.05)), PROBLEM, "fwd", "cpu", SETTINGS)
    assert not passed and reason.startswith("scaled x8") and "out relative error" in reason, reason


# A d128 GQA problem of bench/guards_gpu.py's kind, shorter: there plain PyTorch's own relative error on out at x8 is
# about 4 % (it rounds the large scores to bf16 before its softmax), so twice it let out x 1.05 through (on an H100
# and here); the forward's cap of 8 units of roundoff does not.
REALISTIC = Problem(1, 512, 512, 8, 2, 128, 128, True, name="gqa causal 512")


def test_out_scaled_by_1_05_at_x8_fails_the_gate_where_plain_pytorch_is_4_percent_off():
    passed, _, reason = steps._gate_cases(guarded(_off_at_large_inputs(1.05)), REALISTIC, "fwd", "cpu", SETTINGS)
    assert not passed and reason.startswith("scaled x8") and "out relative error 0.05" in reason and "at most 8 units" in reason, reason
    passed, _, reason = steps._gate_cases(guarded(honest), REALISTIC, "fwd", "cpu", SETTINGS)
    assert passed, reason


def test_without_the_cap_the_relative_rule_let_out_x_1_05_through_on_the_realistic_problem(monkeypatch):
    monkeypatch.setattr(gate, "FORWARD_RELATIVE_CAP", float("inf"))
    passed, _, reason = steps._gate_cases(guarded(_off_at_large_inputs(1.05)), REALISTIC, "fwd", "cpu", SETTINGS)
    assert passed, reason


def test_the_max_error_rule_alone_let_out_x_1_05_through_at_x8(monkeypatch):
    # what the relative rule adds: without it (an infinite relative floor), the same wrong answer passed
    monkeypatch.setattr(gate, "RELATIVE_FLOOR", {torch.bfloat16: float("inf"), torch.float16: float("inf")})
    passed, _, reason = steps._gate_cases(guarded(_off_at_large_inputs(1.05)), PROBLEM, "fwd", "cpu", SETTINGS)
    assert passed, reason


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_an_honest_kernel_is_ok_with_every_timed_output_checked(direction, monkeypatch):
    checked = []
    one = steps.TimedOutputCheck._one

    def counting(self, name, i, *args):
        checked.append((name, i))
        return one(self, name, i, *args)

    monkeypatch.setattr(steps.TimedOutputCheck, "_one", counting)
    spent = {}
    results = steps.measure_step(PROBLEM, direction, [guarded(honest)], device="cpu", settings=SETTINGS, seconds=spent)
    assert results["planted"].status == "ok", results["planted"]
    # every timed call's output, each input set in every round, and the seconds it took (outside the clock)
    assert sorted(checked) == sorted(("planted", i) for _ in range(SETTINGS.rounds) for i in range(SETTINGS.input_sets))
    assert spent["check"] > 0


# ------------------------------------------------------------------------------------------------
# Issue 66: cheats that key on something other than one global call counter (the tensors, the graph, the harness's
# clock and draws, its frames), each caught at its root with the rule named. SETTINGS as above; the first one also
# under the harness's default settings.
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("settings", [SETTINGS, Settings(gate_seed=11)], ids=["small", "default"])
def test_outputs_memoized_per_tensor_object_are_output_reuse(settings):
    # class 1: every input set is rewritten in place before each round, so an earlier output is never right again
    planted = steps.measure_step(PROBLEM, "fwd", [guarded(memo_by_tensor_object(honest))], device="cpu", settings=settings)["planted"]
    assert planted.status == "guard" and planted.reason.startswith("timed call ") and "output_reuse" in planted.reason, planted
    assert "returned the round before" in planted.reason or "follow the values input set" in planted.reason, planted.reason


def memo_gradients(per_tensor: bool, from_call=3):
    """Attention whose backward returns the gradients it returned before, from the `from_call`-th backward through one
    graph (per_tensor False) or on one q tensor (per_tensor True); `stale` counts the gradients it returned so."""
    memo, stale = {}, [0]

    class Memo(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal):
            ctx.inputs, ctx.causal = (q, k, v), causal
            return honest(q, k, v, causal)[0]

        @staticmethod
        def backward(ctx, dout):
            holder = ctx.inputs[0] if per_tensor else ctx
            entry = memo.get(id(holder))
            if entry is None or entry[0] is not holder:  # (held: its id is not reused while the memo keeps it)
                entry = memo[id(holder)] = [holder, 0, None]
            entry[1] += 1
            if entry[1] >= from_call and entry[2] is not None:
                stale[0] += 1
                return (*entry[2], None)
            with torch.enable_grad():
                leaves = [t.detach().requires_grad_() for t in ctx.inputs]
                entry[2] = torch.autograd.grad(honest(*leaves, ctx.causal)[0], leaves, dout)
            return (*entry[2], None)

    def forward(q, k, v, causal):
        return Memo.apply(q, k, v, causal), honest(q.detach(), k.detach(), v.detach(), causal)[1]

    forward.stale = stale
    return forward


def test_gradients_memoized_per_q_tensor_are_output_reuse():
    # class 2 at its root: the timed tensors live through every round, their values and dout do not
    planted = measure(memo_gradients(per_tensor=True), "bwd")["planted"]
    assert planted.status == "guard" and "output_reuse" in planted.reason and planted.reason.startswith("timed call "), planted


def test_no_timed_graph_is_differentiated_a_third_time():
    # class 2 as the issue plants it (the third backward through one graph): each round times a new graph, made off
    # the clock from the rewritten inputs, so the memoized path never runs and the time is the honest backward's
    cheat = memo_gradients(per_tensor=False)
    planted = measure(cheat, "bwd")["planted"]
    assert planted.status == "ok" and cheat.stale[0] == 0, (planted, cheat.stale)


def test_inputs_zeroed_in_place_fail_the_gate_as_input_write():
    with pytest.raises(guards.GuardViolation) as caught:
        steps.gate_candidate(guarded(zeroing_q(honest)), PROBLEM, "fwd", "cpu", SETTINGS)
    assert caught.value.rule == guards.INPUT_WRITE and "changed its input q" in str(caught.value)
    planted = measure(zeroing_q(honest))["planted"]
    assert planted.status == "guard" and "input_write" in planted.reason, planted


def test_inputs_zeroed_in_place_while_timed_are_input_write():
    planted = measure(zeroing_q(honest, calls_before_timing("fwd")))["planted"]
    assert planted.status == "guard" and _first_round(planted.reason) and "input_write" in planted.reason, planted


def test_dout_zeroed_in_the_backward_is_input_write():
    def forward(q, k, v, causal):
        out, lse = honest(q, k, v, causal)
        out.register_hook(lambda grad: grad.zero_())  # a cheaper backward of a zero dout, and the reference would agree
        return out, lse

    planted = measure(forward, "bwd")["planted"]
    assert planted.status == "guard" and "input_write" in planted.reason and "dout" in planted.reason, planted


def patching(module, name, replacement_of, after):
    """A cheat that replaces module.name (with replacement_of(original)) from call `after` + 1 on; honest otherwise."""
    seen = [0]
    original = getattr(module, name)

    def forward(q, k, v, causal):
        seen[0] += 1
        if seen[0] == after + 1:
            setattr(module, name, replacement_of(original))
        return honest(q, k, v, causal)

    return forward


def test_os_urandom_replaced_while_timed_is_harness_access(monkeypatch):
    # class 4: the draw of the set checked whole, were it read from os.urandom at call time, would be known: 0
    import os
    monkeypatch.setattr(os, "urandom", os.urandom)  # put back after the test
    planted = measure(patching(os, "urandom", lambda original: (lambda n: bytes(n)), calls_before_timing("fwd")))["planted"]
    assert planted.status == "guard" and "harness_access" in planted.reason and "os.urandom" in planted.reason, planted


def test_a_clock_stopped_through_logging_time_is_harness_access(monkeypatch):
    # class 5: time.perf_counter reached as logging.time, frozen while the kernel runs; the harness's clock is bound
    import logging
    import time
    monkeypatch.setattr(time, "perf_counter", time.perf_counter)
    frozen = time.perf_counter()
    planted = measure(patching(logging.time, "perf_counter", lambda original: (lambda: frozen), calls_before_timing("fwd")))["planted"]
    assert planted.status == "guard" and "harness_access" in planted.reason and "time.perf_counter" in planted.reason, planted


def test_torch_equal_replaced_to_blind_the_input_check_is_harness_access(monkeypatch):
    # our own: blind the read-only check (torch.equal always True), then zero q in place
    monkeypatch.setattr(torch, "equal", torch.equal)
    turn = calls_before_timing("fwd")
    blind, zeroing = patching(torch, "equal", lambda original: (lambda a, b: True), turn), zeroing_q(honest, turn)

    def forward(q, k, v, causal):
        blind(q, k, v, causal)
        return zeroing(q, k, v, causal)

    planted = measure(forward)["planted"]
    assert planted.status == "guard" and "harness_access" in planted.reason and "torch.equal" in planted.reason, planted


def test_one_output_buffer_for_every_call_is_output_reuse():
    # our own: the output of every timed call written into one buffer (a later call overwrites what an earlier returned)
    turn, seen, buffer = calls_before_timing("fwd"), [0], {}

    def forward(q, k, v, causal):
        seen[0] += 1
        out, lse = honest(q, k, v, causal)
        if seen[0] <= turn:
            return out, lse
        kept = buffer.setdefault("out", torch.empty_like(out))
        return kept.copy_(out), lse

    planted = measure(forward)["planted"]
    assert planted.status == "guard" and _first_round(planted.reason) and "shares memory with the out of call" in planted.reason, planted


def first_and_last_rows(q, k, v, causal):
    """The rows every guard call checks (the first and the last), nothing between."""
    out, lse = honest(q, k, v, causal)
    out = out.clone()
    out[:, 1:-1] = 0
    return out, lse


def test_only_the_first_and_last_rows_computed_is_incorrect():
    # our own: the rows of the timed check and the set checked whole are drawn after the call
    planted = measure(after_calls(calls_before_timing("fwd"), honest, first_and_last_rows))["planted"]
    assert planted.status == "incorrect" and _first_round(planted.reason) and "out " in planted.reason, planted


def test_wrong_on_one_timed_call_that_is_not_the_last_is_caught_by_its_index():
    # class 7: every timed output is checked, not one drawn per round: a cheat wrong on timed call 1 only is caught there
    turn = calls_before_timing("fwd")
    wrong_from_the_second = after_calls(turn + 1, honest, lambda q, k, v, c: (torch.zeros_like(honest(q, k, v, c)[0]), None))
    planted = measure(after_calls(turn + 2, wrong_from_the_second, honest))["planted"]  # (and right again from the third)
    assert planted.status == "incorrect" and planted.reason.startswith("timed call 1 "), planted


def test_a_time_below_the_memory_floor_is_refused():
    # a clock that reports next to nothing (the stopped clock's effect): refused as impossible on the device's bandwidth
    class InstantTimer:
        def time_calls(self, calls, flush=None):
            return [1e-9 for fn in calls if fn() is not None or True]

    results = steps.measure_step(PROBLEM, "fwd", [guarded(honest)], device="cpu", settings=SETTINGS, timer=InstantTimer(),
                                 memory_bandwidth=1e12)
    planted = results["planted"]
    assert planted.status == "guard" and "below_memory_floor" in planted.reason, planted


# Classes 4 and 6 before any code runs: frames and tracebacks, computed names, the modules the harness runs on.
@pytest.mark.parametrize("source, what", [
    ("try:\n    1 / 0\nexcept ZeroDivisionError as err:\n    frame = err.__traceback__.tb_frame.f_back\n    seed = frame.f_locals['settings']",
     "__traceback__"),
    ("def f(tb):\n    return tb.tb_frame.f_back.f_locals", "tb_frame"),
    ("import sys\ninfo = sys.exc_info()", "sys.exc_info"),
    ("def f(g):\n    return g.gi_frame.f_globals", "gi_frame"),
    ("def f(fn):\n    return fn.__globals__['settings']", "__globals__"),
    ("import traceback\nframes = traceback.walk_stack(None)", "traceback"),
    ("import logging\nframe = logging.currentframe()", "logging.currentframe"),
    ("import os\nos.urandom = lambda n: bytes(n)", "assignment to os.urandom"),
    ("import logging\nclock = logging.time\nsetattr(clock, 'perf_' + 'counter', lambda: 0.0)", "<computed name>"),
    ("import logging\nlogging.time.perf_counter = lambda: 0.0", "logging.time.perf_counter"),
    ("import torch\nc = torch.cuda\nS = getattr(c, 'Str' + 'eam')", "getattr(torch.cuda, <computed name>)"),
    ("import torch\nc = torch.cuda\nE = getattr(c, 'Ev' + 'ent')", "getattr(torch.cuda, <computed name>)"),
    ("import torch\nc = torch.cuda\nE = c.Event", "torch.cuda.Event"),
    ("import torch\nf = torch.nn.functional\nA = getattr(f, 'scaled_dot_' + 'product_attention')", "<computed name>"),
    ("import os\nenv = getattr(os, 'envi' + 'ron')", "getattr(os, <computed name>)"),
    ("import torch\nE = getattr(getattr(torch, 'cuda'), 'Event')", "getattr(torch.cuda, 'Event')"),
    ("def f(x, name, value):\n    setattr(x, name, value)", "setattr(x, <computed name>)"),
    ("import torch\ntorch.equal = lambda a, b: True", "assignment to torch.equal"),
    # the plain reference's cuBLAS reductions loosened through the private setter (the public flag is an assignment)
    ("import torch\ntorch._C._set_cublas_allow_bf16_reduced_precision_reduction(True)", "torch._C"),
    ("import torch\ntorch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True",
     "assignment to torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction"),
])
def test_frames_computed_names_and_module_patches_are_refused_statically(source, what):
    violations = guards.check_source_text(source, "experiment.py")
    assert any(what in v.what for v in violations), violations


def test_the_references_run_with_the_numerics_of_the_harness_s_import_whatever_a_candidate_set():
    """A candidate that flipped cuBLAS's reduced-precision reductions (or TF32) at run time would loosen the plain
    reference, and the gate's tolerance with it: the references run with the flags the harness was imported with."""
    matmul = torch.backends.cuda.matmul
    before = (matmul.allow_bf16_reduced_precision_reduction, matmul.allow_fp16_reduced_precision_reduction,
              torch.get_float32_matmul_precision())
    try:
        matmul.allow_bf16_reduced_precision_reduction = not gate._PLAIN_REDUCTIONS[0]
        matmul.allow_fp16_reduced_precision_reduction = not gate._PLAIN_REDUCTIONS[1]
        torch.set_float32_matmul_precision("medium")
        with gate._fp32_matmul_exact():
            inside = (matmul.allow_bf16_reduced_precision_reduction, matmul.allow_fp16_reduced_precision_reduction,
                      torch.get_float32_matmul_precision())
        assert inside == (*gate._PLAIN_REDUCTIONS, "highest")
        assert matmul.allow_bf16_reduced_precision_reduction == (not gate._PLAIN_REDUCTIONS[0])  # restored after
    finally:
        matmul.allow_bf16_reduced_precision_reduction, matmul.allow_fp16_reduced_precision_reduction = before[:2]
        torch.set_float32_matmul_precision(before[2])


def test_a_kernel_may_still_read_its_own_objects_fields_by_computed_name():
    # kernels/cmask_backward_sm120.py copies a dataclass by its fields; a delegate forwards __getattr__
    assert guards.check_source_text("import dataclasses\ndef copy(m):\n    return [getattr(m, f.name) for f in dataclasses.fields(m)]") == []
