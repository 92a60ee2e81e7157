"""The guardrails (fa4tune.harness.guards and runtime_guards, wired into the harness): each one catches a planted cheating kernel on CPU
tensors, and an honest kernel passes all of them."""

import os
import subprocess
import sys
import threading
import types

import pytest
import torch

import prepare
from fa4tune import cli
from fa4tune.config import Problem
from fa4tune.harness import candidates, gate, gpu, guards, results_tsv, runs, runtime_guards, steps
from fa4tune.harness.results_tsv import read_rows
from fa4tune.harness.settings import EXPERIMENT_PATH, Settings
from fa4tune.targets import get_target
from prepare_child_targets import torch_attention

torch.set_num_threads(1)  # tiny CPU matmuls crawl on two contended threads

SETTINGS = Settings(gate_seed=5, warmup=1, rounds=1, input_sets=1, gate_random_problems=1)
CAUSAL_GQA = Problem(1, 48, 48, 4, 2, 32, 32, True, name="tiny gqa causal")
PLAIN = Problem(1, 40, 40, 2, 2, 32, 32, False, name="tiny")
CPU = runs.RunContext(get_target("sm120"), gpu.DeviceInfo("cpu (test)", (0, 0), 1), "cpu")
_CAPTURED_SDPA = torch.nn.functional.scaled_dot_product_attention  # taken before any trap is set


def honest(q, k, v, causal):
    return torch_attention(q, k, v, causal, return_lse=True)


def guarded(forward, name="planted"):
    return candidates.Candidate(name, forward, {}, guarded=True)


def gate_guarded(forward, direction="fwd", problem=CAUSAL_GQA):
    """the harness's gate on a guarded candidate: (passed, reason), or GuardViolation."""
    passed, _, reason = steps.gate_candidate(guarded(forward), problem, direction, "cpu", SETTINGS)
    return passed, reason


def sdpa(q, k, v, causal, function=None):
    out = (function or torch.nn.functional.scaled_dot_product_attention)(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal, enable_gqa=q.shape[2] != k.shape[2])
    return out.transpose(1, 2), None


# ------------------------------------------------------------------------------------------------
# An honest kernel passes every guard.
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_an_honest_kernel_passes_the_gate_and_every_guard(direction):
    assert gate_guarded(honest, direction) == (True, "")
    runtime_guards.check_candidate(honest, PLAIN, direction, "cpu", seed=3, sync=FakeDevice())  # an idle side stream changes nothing


def test_the_real_experiment_py_passes_the_static_rules():
    assert guards.check_source(EXPERIMENT_PATH) == []


def test_sdpa_is_only_trapped_for_guarded_candidates():
    # the baselines run torch SDPA in the same step as experiment.py's candidate
    results = steps.measure_step(PLAIN, "fwd", [guarded(lambda q, k, v, c: sdpa(q, k, v, c), "cheat"), candidates.sdpa_candidate()],
                                   device="cpu", settings=SETTINGS)
    assert results["cheat"].status == "guard" and "scaled_dot_product_attention" in results["cheat"].reason
    assert results["torch sdpa"].status == "ok"
    assert torch.nn.functional.scaled_dot_product_attention is _CAPTURED_SDPA  # put back after the trap


# ------------------------------------------------------------------------------------------------
# (a) Other attention implementations and self-timing: the static check of experiment.py's source.
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("source,rule", [
    ("import torch.nn.functional as F\nF.scaled_dot_product_attention(q, k, v)", "other_attention"),
    ("from torch.nn.functional import scaled_dot_product_attention as attend", "other_attention"),
    ("import torch\nx = torch.nn.functional.scaled_dot_product_attention", "other_attention"),
    ("from torch.nn import functional\nf = getattr(functional, 'scaled_dot_product_attention')", "other_attention"),
    ("import torch\nout = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v)", "other_attention"),
    ("from torch.nn.attention.flex_attention import flex_attention", "other_attention"),
    ("from flash_attn import flash_attn_func", "other_attention"),  # FA2
    ("import flash_attn_interface", "other_attention"),  # FA3
    ("import xformers.ops as xops\nxops.memory_efficient_attention(q, k, v)", "other_attention"),
    ("import torch\ntorch.backends.cudnn.enabled = True", "other_attention"),
    ("import torch\ntorch._cudnn_attention(q, k, v)", "other_attention"),
    ("from flash_attn.cute.flash_fwd_sm90 import FlashAttentionForwardSm90", "other_attention"),  # wgmma: not on SM120
    ("from flash_attn.cute.interface import flash_attn_func", "other_attention"),  # FA4's own dispatch
    ("import time\nt0 = time.perf_counter()", "self_timing"),
    ("from time import perf_counter as clock", "self_timing"),
    ("import torch\nstart = torch.cuda.Event(enable_timing=True)", "self_timing"),
    ("from triton.testing import do_bench", "self_timing"),
    ("import torch\ns = torch.cuda.Stream()", "side_stream"),
    ("import torch\nwith torch.cuda.stream(s):\n    pass", "side_stream"),
    ("import cuda.bindings.driver as cuda\ncuda.cuStreamCreate(0)", "side_stream"),
    # the private switch bench/guards_gpu.py's side-stream cheat uses: the run-time readiness check alone missed it
    # once on a 1k d64 problem (its work done before the check looked, 2026-12-05 H100 run)
    ("import torch\ntorch._C._cuda_setStream(stream_id=1, device_index=0, device_type=1)", "side_stream"),
    ("import torch\ns = torch._C._cuda_getStreamFromPool(False, 0)", "side_stream"),
    ("import threading\nthreading.Thread(target=print).start()", "deferred_work"),
    ("import prepare", "harness_access"),
    ("from fa4tune.harness import gate\ngate.RTOL = 1e9", "harness_access"),
    ("import fa4tune.config\nfa4tune.harness.timing.benchmark = None", "harness_access"),
    ("from fa4tune.harness.settings import TIMED_ROUNDS", "harness_access"),  # every module of the package, new ones too
    ("import fa4tune.harness.steps as steps\nsteps.measure_step = None", "harness_access"),
    ("from fa4tune import harness", "harness_access"),
    ("import fa4tune.guards", "harness_access"),
    ("import os\nos.environ['FLASH_ATTENTION_ARCH'] = 'sm_90'", "harness_access"),
    ("import sys\nsys.modules['fa4tune.harness.gate'].RTOL = 1e9", "harness_access"),
    ("import sys\nme = sys.modules[__name__]", "harness_access"),  # (the old command line's one exception is gone)
    ("exec(open('other.py').read())", "harness_access"),
    ("from torch.nn.functional import *", "harness_access"),
])
def test_the_static_check_names_the_rule_and_the_line(source, rule):
    violations = guards.check_source_text("x = 1\n" + source, "experiment.py")
    assert violations and violations[0].rule == rule, violations
    assert violations[0].line >= 2
    assert str(violations[0]).startswith(f"guard {rule}: experiment.py:{violations[0].line} uses ")


@pytest.mark.parametrize("source", [
    "from flash_attn.cute.flash_fwd_sm120 import FlashAttentionForwardSm120",
    "from flash_attn.cute import utils\nfrom flash_attn.cute.pack_gqa import PackGQA",
    "import torch\nstream = torch.cuda.current_stream()",
    "import cuda.bindings.driver as cuda\ndef f(stream: cuda.CUstream = None): pass",
    "import math\nscale = 1.0 / math.sqrt(128)",
])
def test_the_static_check_allows_what_the_sm120_kernels_need(source):
    assert guards.check_source_text(source) == []


def test_run_experiment_refuses_a_cheating_experiment_file_before_running_anything(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "experiment", sys.modules.get("experiment"))
    monkeypatch.setattr(guards, "harness_changes", lambda: [])  # (the pin has its own tests)
    cheat = tmp_path / "experiment.py"
    cheat.write_text("import torch.nn.functional as F\nimport time\n\ndef attention(q, k, v, **kw):\n"
                     "    t = time.perf_counter()\n    return F.scaled_dot_product_attention(q, k, v)\n")
    results = tmp_path / "results.tsv"
    monkeypatch.setattr(prepare, "run_experiment", lambda *a, **k: pytest.fail("the refused file reached run_experiment"))
    code = prepare.main(["--experiment", str(cheat)])  # load_experiment admits the file (guards.admit) before it runs
    assert code == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert errors == [
        "error: guard self_timing: experiment.py:2 uses import time (only the harness times kernels)",
        "error: guard self_timing: experiment.py:5 uses time.perf_counter (only the harness times kernels)",
        "error: guard other_attention: experiment.py:6 uses torch.nn.functional.scaled_dot_product_attention "
        "(experiment.py computes attention with its own SM120 kernels, never by calling another implementation)",
    ]
    assert not results.exists()


def test_experiment_py_command_line_refuses_too_before_the_file_runs(tmp_path, capsys):
    cheat = tmp_path / "experiment.py"
    ran = tmp_path / "ran"
    cheat.write_text(f"from flash_attn import flash_attn_func\nopen({str(ran)!r}, 'w').close()\n")
    assert cli.experiment_main(cheat, ["--static"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: guard other_attention: experiment.py:1 uses from flash_attn import flash_attn_func "
        "(experiment.py computes attention with its own SM120 kernels, never by calling another implementation)"]
    assert not ran.exists()


def test_a_kernel_class_derived_from_an_sm90_kernel_is_refused():
    FlashAttentionForwardSm90 = type("FlashAttentionForwardSm90", (), {})  # stands in for upstream's wgmma kernel
    sneaky = type("FastForward", (FlashAttentionForwardSm90,), {})
    module = types.SimpleNamespace(FastForward=sneaky, TunedBackwardSm120=object, tile_m=128)  # what experiment.py defines
    (violation,) = guards.check_kernel_classes(module)
    assert violation.rule == "other_attention" and "FastForward derived from FlashAttentionForwardSm90" in violation.what


# ------------------------------------------------------------------------------------------------
# (a) ... and the trap: indirect calls while the harness runs experiment.attention.
# ------------------------------------------------------------------------------------------------


def _via_module_attribute(q, k, v, causal):
    return sdpa(q, k, v, causal)  # looks torch.nn.functional.scaled_dot_product_attention up at call time


def _via_captured_function(q, k, v, causal):
    return sdpa(q, k, v, causal, function=_CAPTURED_SDPA)  # taken at import: only the aten-level trap sees it


def _swallowing(q, k, v, causal):
    try:
        return sdpa(q, k, v, causal)
    except Exception:
        return honest(q, k, v, causal)  # caught the trap's exception, and answers correctly anyway


def _imports_xformers(q, k, v, causal):
    try:
        import xformers.ops  # noqa: F401
    except ImportError:
        pass
    return honest(q, k, v, causal)


def _patches_the_gate(q, k, v, causal):
    gate.RTOL = 1e9
    return honest(q, k, v, causal)


@pytest.mark.parametrize("forward,needle", [
    (_via_module_attribute, "called torch.nn.functional.scaled_dot_product_attention"),
    (_via_captured_function, "ran the aten op aten::_scaled_dot_product"),
    (_swallowing, "called torch.nn.functional.scaled_dot_product_attention"),
    (_imports_xformers, "imported xformers"),
])
def test_the_trap_catches_other_attention_reached_at_run_time(forward, needle):
    with pytest.raises(guards.GuardViolation, match="guard other_attention") as caught:
        gate_guarded(forward, problem=PLAIN)  # causal off: SDPA's top-left causal would fail the gate first
    assert needle in str(caught.value)


def test_the_trap_catches_a_kernel_that_patches_the_harness(monkeypatch):
    monkeypatch.setattr(gate, "RTOL", gate.RTOL)  # put back after the test
    with pytest.raises(guards.GuardViolation, match="guard harness_access: .*fa4tune.harness.gate.RTOL"):
        gate_guarded(_patches_the_gate)


def _patches_the_results_log(q, k, v, causal):
    results_tsv.append_row = lambda path, row: None
    return honest(q, k, v, causal)


def test_the_trap_seals_every_module_of_the_harness_package(monkeypatch):
    # results_tsv was sealed by no list before: the package's prefix seals it with the rest
    monkeypatch.setattr(results_tsv, "append_row", results_tsv.append_row)  # put back after the test
    with pytest.raises(guards.GuardViolation, match="guard harness_access: .*fa4tune.harness.results_tsv.append_row"):
        gate_guarded(_patches_the_results_log)


def test_the_trap_covers_the_backward_too():
    class SdpaBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            ctx.save_for_backward(q, k, v)
            return honest(q, k, v, False)[0]

        @staticmethod
        def backward(ctx, dout):
            q, k, v = (t.detach().requires_grad_() for t in ctx.saved_tensors)
            with torch.enable_grad():
                out, _ = sdpa(q, k, v, False, function=_CAPTURED_SDPA)
            return torch.autograd.grad(out, (q, k, v), dout)

    with pytest.raises(guards.GuardViolation, match="guard other_attention"):
        gate_guarded(lambda q, k, v, causal: (SdpaBackward.apply(q, k, v), None), "bwd", PLAIN)


# ------------------------------------------------------------------------------------------------
# (b) Output reuse across calls.
# ------------------------------------------------------------------------------------------------


def _memoizing(q, k, v, causal):
    """Returns the output cached on the same tensor objects at the same versions: the gate's fresh tensors
    never hit the cache; the timing loop's reused input sets always would."""
    key = (id(k), id(v), q._version, k._version, v._version)
    memo = getattr(q, "memo", None)
    if memo is not None and memo[0] == key:
        return memo[1]
    q.memo = (key, honest(q, k, v, causal))
    return q.memo[1]


def _persistent_buffer():
    """Correct values, but always in the same buffer (a caller holding the last output sees it change)."""
    buffers = {}

    def forward(q, k, v, causal):
        out, lse = honest(q, k, v, causal)
        buffer = buffers.setdefault(tuple(out.shape), torch.empty_like(out))
        buffer.copy_(out)
        return buffer, lse

    return forward


def _writes_into_q(q, k, v, causal):
    out, lse = honest(q, k, v, causal)
    q.data.copy_(out)  # head_dim == head_dim_v: reuses the input's memory
    return q.detach(), lse


def test_a_memoizing_kernel_passes_the_gate_but_not_the_reuse_guard():
    assert steps._gate_cases(guarded(_memoizing), CAUSAL_GQA, "fwd", "cpu", SETTINGS)[0]  # the gate alone does not see it
    with pytest.raises(guards.GuardViolation, match=r"guard output_reuse: call 3 \(set A's tensors rewritten in place\): (out shares memory with out of call 1|returned the same out as call 1)"):
        gate_guarded(_memoizing)


def test_an_output_in_a_persistent_buffer_is_reuse():
    with pytest.raises(guards.GuardViolation, match=r"guard output_reuse: call 2 .*: out shares memory with out of call 1"):
        gate_guarded(_persistent_buffer())


def test_an_output_written_into_an_input_is_input_write():
    with pytest.raises(guards.GuardViolation, match=r"guard input_write: call 1 \(set A\): the call changed its input q"):
        runtime_guards.check_candidate(_writes_into_q, PLAIN, "fwd", "cpu", seed=3)


def test_memoized_gradients_are_reuse():
    class MemoBackward(torch.autograd.Function):
        """Caches the gradients on the graph's node, keyed by dout's address and version: the timing loop's
        repeated backward through one graph with one dout would hit it every time."""

        @staticmethod
        def forward(ctx, q, k, v):
            ctx.save_for_backward(q, k, v)
            ctx.memo = None
            return honest(q, k, v, True)[0]

        @staticmethod
        def backward(ctx, dout):
            key = (dout.data_ptr(), dout._version)
            if ctx.memo is None or ctx.memo[0] != key:
                q, k, v = (t.detach().requires_grad_() for t in ctx.saved_tensors)
                with torch.enable_grad():
                    out, _ = honest(q, k, v, True)
                ctx.memo = (key, torch.autograd.grad(out, (q, k, v), dout))
            return ctx.memo[1]

    def forward(q, k, v, causal):
        return MemoBackward.apply(q, k, v), None

    assert steps._gate_cases(guarded(forward), CAUSAL_GQA, "bwd", "cpu", SETTINGS)[0]  # the gate alone does not see it
    with pytest.raises(guards.GuardViolation, match=r"guard output_reuse: backward 2 \(dout rewritten in place\): (dq shares memory with dq of backward 1|returned the same dk)"):
        gate_guarded(forward, "bwd")


# ------------------------------------------------------------------------------------------------
# (c) Side streams, with a fake device (the CUDA path is the same code with CudaSync).
# ------------------------------------------------------------------------------------------------


class FakeDevice:
    """Stands in for a GPU with a side stream: work queued there runs only at synchronize(); waiting on an
    event of the current stream does not wait for it."""

    def __init__(self):
        self.side_stream_work = []
        self.current = "main stream"

    def current_stream(self):
        return self.current

    def wait_current_stream(self):
        pass  # the current stream has nothing pending in this fake

    def synchronize(self):
        while self.side_stream_work:
            self.side_stream_work.pop(0)()


def test_output_written_on_a_side_stream_is_not_ready():
    device = FakeDevice()

    def forward(q, k, v, causal):
        out, lse = honest(q, k, v, causal)
        result = torch.full_like(out, float("nan"))
        device.side_stream_work.append(lambda: result.copy_(out))  # launched without making the caller's stream wait
        return result, lse

    with pytest.raises(guards.GuardViolation, match="guard not_ready: call 1 .*: out changed after the call returned"):
        runtime_guards.check_candidate(forward, PLAIN, "fwd", "cpu", seed=3, sync=device)


def test_a_call_that_leaves_another_stream_current_is_caught():
    device = FakeDevice()

    def forward(q, k, v, causal):
        device.current = "side stream"
        return honest(q, k, v, causal)

    with pytest.raises(guards.GuardViolation, match="guard side_stream: call 1 .*another current stream"):
        runtime_guards.check_candidate(forward, PLAIN, "fwd", "cpu", seed=3, sync=device)


def _creates_a_stream(q, k, v, causal):
    try:
        torch.cuda.Stream()
    except Exception:
        pass  # no CUDA here, or the trap: either way answer correctly
    return honest(q, k, v, causal)


def _switches_streams(q, k, v, causal):
    try:
        torch.cuda.set_stream(types.SimpleNamespace(stream_id=1, device_index=0, device_type=1))
    except Exception:
        pass
    return honest(q, k, v, causal)


@pytest.mark.parametrize("forward,needle", [(_creates_a_stream, "created a CUDA stream"), (_switches_streams, "switched the current CUDA stream")])
def test_creating_or_switching_streams_during_the_call_is_caught(forward, needle):
    with pytest.raises(guards.GuardViolation, match=f"guard side_stream: {needle}"):
        gate_guarded(forward)


# ------------------------------------------------------------------------------------------------
# (d) Outputs written lazily, or not plain tensors.
# ------------------------------------------------------------------------------------------------


class LazyTensor(torch.Tensor):
    """A tensor subclass: could compute its values when first read, after the timed region."""


def test_a_tensor_subclass_output_passes_the_gate_but_not_the_type_guard():
    def forward(q, k, v, causal):
        out, lse = honest(q, k, v, causal)
        return out.as_subclass(LazyTensor), lse

    assert steps._gate_cases(guarded(forward), CAUSAL_GQA, "fwd", "cpu", SETTINGS)[0]
    with pytest.raises(guards.GuardViolation, match="guard output_type: call 1 .*: out is a test_guards.LazyTensor, not a torch.Tensor"):
        gate_guarded(forward)


def test_an_output_finished_by_a_thread_after_the_call_is_caught():
    def forward(q, k, v, causal):
        out, lse = honest(q, k, v, causal)
        result = torch.zeros_like(out)
        timer = threading.Timer(0.5, lambda: result.copy_(out))
        timer.start()
        forward.timers.append(timer)
        return result, lse

    forward.timers = []
    try:
        with pytest.raises(guards.GuardViolation, match=r"guard deferred_work: call 1 .*: left 1 thread\(s\) running"):
            runtime_guards.check_candidate(forward, PLAIN, "fwd", "cpu", seed=3)
    finally:
        for timer in forward.timers:
            timer.cancel()


def test_a_forward_done_lazily_in_the_backward_is_caught():
    class LazyForward(torch.autograd.Function):
        """Returns an unwritten out and fills it in during the backward (which the gate checks it after)."""

        @staticmethod
        def forward(ctx, q, k, v):
            ctx.save_for_backward(q, k, v)
            ctx.out = torch.zeros(q.shape[:3] + (v.shape[-1],), dtype=q.dtype)
            return ctx.out

        @staticmethod
        def backward(ctx, dout):
            q, k, v = (t.detach().requires_grad_() for t in ctx.saved_tensors)
            with torch.enable_grad():
                out, _ = honest(q, k, v, True)
            ctx.out.copy_(out.detach())
            return torch.autograd.grad(out, (q, k, v), dout)

    def forward(q, k, v, causal):
        return LazyForward.apply(q, k, v), None

    assert steps._gate_cases(guarded(forward), CAUSAL_GQA, "bwd", "cpu", SETTINGS)[0]  # checked after the backward, out looks right
    with pytest.raises(guards.GuardViolation, match=r"guard output_reuse: forward \(set A, recording autograd\): does not match the reference"):
        gate_guarded(forward, "bwd")


def test_a_graph_under_no_grad_is_caught():
    def forward(q, k, v, causal):
        out, lse = honest(q, k, v, causal)
        return out.detach().requires_grad_(), lse  # a leaf that "requires grad" where nothing is recorded

    with pytest.raises(guards.GuardViolation, match="guard output_type: call 1 .*: out carries an autograd graph under torch.no_grad"):
        gate_guarded(forward)


# ------------------------------------------------------------------------------------------------
# (e) Edits to the harness: pinned hashes.
# ------------------------------------------------------------------------------------------------


def test_the_shipped_pin_matches_the_harness():
    changed = guards.harness_changes()
    assert changed == [], f"{changed} changed: a maintainer re-pins with `uv run python -m fa4tune.guards --pin`"


def _pinned_copy(root):
    """The harness's files copied under root, with their pin; the pin's path."""
    for name in guards.harness_files():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes((guards.ROOT / name).read_bytes())
    pin = root / "harness.sha256"
    guards.write_pin(root, pin)
    return pin


def test_an_edited_harness_file_is_named(tmp_path):
    pin = _pinned_copy(tmp_path)
    assert guards.harness_changes(tmp_path, pin) == []
    with open(tmp_path / "prepare.py", "a") as f:
        f.write("GATE_SCALE = 1.0\n")
    (tmp_path / "fa4tune/harness/timing.py").unlink()
    assert guards.harness_changes(tmp_path, pin) == ["prepare.py", "fa4tune/harness/timing.py"]
    assert guards.harness_changes(tmp_path, tmp_path / "missing.sha256") == guards.harness_files(tmp_path)


def test_a_new_file_in_the_harness_package_is_named_until_pinned(tmp_path):
    pin = _pinned_copy(tmp_path)
    (tmp_path / "fa4tune/harness/faster_timing.py").write_text("TIMED_ROUNDS = 1\n")
    (tmp_path / "fa4tune/harness/__pycache__").mkdir(exist_ok=True)
    (tmp_path / "fa4tune/harness/__pycache__/gate.cpython-311.pyc").write_bytes(b"bytecode")  # a cache is no harness file
    assert guards.harness_changes(tmp_path, pin) == ["fa4tune/harness/faster_timing.py"]
    guards.write_pin(tmp_path, pin)
    assert guards.harness_changes(tmp_path, pin) == []


def test_pin_command_writes_every_harness_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(guards, "PIN_PATH", tmp_path / "harness.sha256")
    assert guards.main(["--pin"]) == 0
    pins = guards.read_pin(tmp_path / "harness.sha256")
    assert list(pins) == guards.harness_files()
    assert pins["prepare.py"] == runs.prepare_sha256()


FAKE_EXPERIMENT = '''
from fa4tune import defaults
from tests.prepare_child_targets import torch_attention as attention

forward_config = defaults.upstream_forward
backward_config = defaults.upstream_backward
'''
ONE_PROBLEM = '{"problems": [{"name": "tiny decode", "batch": 1, "seqlen_q": 1, "seqlen_k": 40, "num_heads": 2, "num_heads_kv": 1, "head_dim": 32, "causal": false, "backward": false}]}'


def _run_with_pin(tmp_path, monkeypatch, pin_text):
    monkeypatch.setitem(sys.modules, "experiment", sys.modules.get("experiment"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    pin = tmp_path / "harness.sha256"
    pin.write_text(pin_text)
    monkeypatch.setattr(guards, "PIN_PATH", pin)
    (tmp_path / "experiment.py").write_text(FAKE_EXPERIMENT)
    (tmp_path / "suite.json").write_text(ONE_PROBLEM)
    results = tmp_path / "results.tsv"
    try:
        module = candidates.load_experiment(tmp_path / "experiment.py")  # admitted first: the static rules and the pin
    except guards.Refused as refused:  # (prepare.main prints these and exits 2, as run_experiment does)
        for line in refused.lines:
            runs.error(line)
        return 2, results
    code = prepare.run_experiment(module, str(tmp_path / "suite.json"),
                                  description="pin test", results_path=results, context=CPU, device="cpu", settings=SETTINGS)
    return code, results


def _edited_pin():
    text = guards.PIN_PATH.read_text()
    return text.replace(guards.file_sha256(guards.ROOT / "prepare.py"), "0" * 64)


def test_run_experiment_refuses_an_edited_prepare_py(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(guards.ALLOW_HARNESS_EDIT, raising=False)
    code, results = _run_with_pin(tmp_path, monkeypatch, _edited_pin())
    assert code == 2 and not results.exists()
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: guard harness_edit: prepare.py differ from the hashes pinned in fa4tune/harness.sha256")
    assert "uv run python -m fa4tune.guards --pin" in line and "git checkout -- prepare.py" in line


def test_an_allowed_harness_edit_runs_and_marks_the_row(tmp_path, monkeypatch):
    monkeypatch.setenv(guards.ALLOW_HARNESS_EDIT, "1")
    code, results = _run_with_pin(tmp_path, monkeypatch, _edited_pin())
    assert code == 0
    (row,) = read_rows(results).rows
    assert row.description == "[harness edited: prepare.py] pin test"
    assert row.config["harness_edited"] == ["prepare.py"]
    assert row.prepare_sha256 == guards.file_sha256(guards.ROOT / "prepare.py")


def test_guards_command_checks_an_experiment_file(tmp_path):
    cheat = tmp_path / "experiment.py"
    cheat.write_text("import torch\nevent = torch.cuda.Event(enable_timing=True)\n")
    done = subprocess.run([sys.executable, "-m", "fa4tune.guards", str(cheat)], capture_output=True, text=True, timeout=120,
                          cwd=guards.ROOT, env={**os.environ, "PYTHONPATH": str(guards.ROOT)})
    assert done.returncode == 2  # a violation is a refusal, as everywhere
    assert "error: guard self_timing: experiment.py:2 uses torch.cuda.Event" in done.stderr
    assert done.stdout.startswith("guards: 1 violation(s) in experiment.py")


def test_the_guard_status_is_a_measurement_status():
    from fa4tune.harness.measurement import STATUSES

    assert "guard" in STATUSES
    assert steps._status_of_error(guards.GuardViolation("output_reuse", "x")) == "guard"
