"""fa4tune.harness.isolation and the harness's step runner: a crash or hang in a child becomes a result; the parent goes on."""

import os
import time
from pathlib import Path

from fa4tune.config import Problem
from fa4tune.harness import evaluation, isolation, steps
from fa4tune.harness.settings import Settings

ROOT = str(Path(__file__).resolve().parent.parent)
TARGETS = "tests.prepare_child_targets"


def run(function, kwargs=None, **options):
    options.setdefault("timeout_s", 60)
    return isolation.run_in_child(f"{TARGETS}:{function}", kwargs, sys_path=[ROOT], cwd=ROOT, **options)


def test_a_plain_function_returns_its_value():
    result = run("add", {"a": 2, "b": 3})
    assert result.status == "ok" and result.value == 5 and result.exit_code == 0


def test_segfault_is_a_crash_and_keeps_the_values_sent_before():
    result = run("count_then_segfault", {"n": 3})
    assert result.status == "crash"
    assert "SIGSEGV" in result.reason
    assert result.values == (0, 1, 2)
    # the parent goes on: the next child runs normally
    assert run("add", {"a": 1, "b": 1}).value == 2


def test_hang_is_a_timeout_and_the_whole_process_group_is_killed():
    started = time.monotonic()
    result = run("hang_with_worker", timeout_s=1.0, startup_timeout_s=60)
    assert result.status == "timeout"
    assert "killed" in result.reason
    assert time.monotonic() - started < 30
    worker = result.value
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            break
        # a zombie that init has not reaped yet counts as gone
        with open(f"/proc/{worker}/stat") as f:
            if f.read().split(")")[-1].split()[0] == "Z":
                break
        time.sleep(0.1)
    else:
        raise AssertionError(f"grandchild {worker} outlived the timeout kill")


def test_the_time_limit_runs_per_value_after_the_first():
    result = run("start_then_hang", timeout_s=1.0, startup_timeout_s=60)
    assert result.status == "timeout" and result.values == ("started",)
    assert "next result" in result.reason


def test_exception_and_exit_code_are_crashes_with_their_reason():
    raised = run("raise_error")
    assert raised.status == "crash"
    assert "RuntimeError: CUDA error: an illegal memory access" in raised.reason
    exited = run("exit_code", {"code": 3})
    assert exited.status == "crash" and exited.reason.startswith("exit code 3")


def test_describe_exit():
    assert isolation.describe_exit(-11) == "killed by signal SIGSEGV"
    assert isolation.describe_exit(-9) == "killed by signal SIGKILL"
    assert isolation.describe_exit(2) == "exit code 2"


def _spec(name):
    return {"name": name, "kind": "callable", "factory": f"{TARGETS}:{name}_candidate"}


def test_step_runner_marks_only_the_failing_candidate_and_goes_on():
    small = Problem(1, 48, 48, 2, 2, 32, 32, True, backward=False, name="tiny causal")
    # three children: the first dies in the two-candidate step (which is then split), the second
    # runs the split candidates (the segfault kills it), the third runs the rest and hangs in the last
    four = [
        steps.Step(small, "fwd", [_spec("correct"), _spec("segfault")]),
        steps.Step(small, "fwd", [_spec("missing")]),
        steps.Step(small, "fwd", [_spec("wrong")]),
        steps.Step(small, "fwd", [_spec("hang")]),
    ]
    settings = Settings(gate_seed=7, warmup=1, rounds=1, input_sets=1, gate_random_problems=1)
    seen = []
    results = evaluation.run_steps_isolated(
        four, settings, timeout_s=3.0, device="cpu", env={**os.environ, "OMP_NUM_THREADS": "1"}, on_result=lambda step, name, r: seen.append((name, r.status)),
    )
    statuses = [{name: r.status for name, r in step.items()} for step in results]
    assert statuses == [
        {"correct": "ok", "segfault": "crash"},  # retried one by one: the correct candidate still ran
        {"missing": "crash"},  # could not be built: a result, and the same child goes on
        {"wrong": "incorrect"},
        {"hang": "timeout"},
    ]
    assert results[1]["missing"].reason.startswith("cannot build the candidate: AttributeError")
    assert "SIGSEGV" in results[0]["segfault"].reason
    assert results[0]["correct"].tflops > 0
    assert results[2]["wrong"].ms_median is None  # an incorrect config is never timed
    assert "out max error" in results[2]["wrong"].reason
    assert sorted(seen) == [("correct", "ok"), ("hang", "timeout"), ("missing", "crash"), ("segfault", "crash"), ("wrong", "incorrect")]


def test_after_a_device_fault_the_child_reports_what_is_left_and_stops(monkeypatch):
    from fa4tune.harness.measurement import ProblemResult

    small = Problem(1, 48, 48, 2, 2, 32, 32, False, backward=False)

    def faulting(problem, direction, candidates, **kw):
        names = [c.name for c in candidates]
        lost = {names[0]: ProblemResult(problem.label, direction, "crash", reason="AcceleratorError: CUDA error: illegal address")}
        raise steps.StepContextLost(lost, names[1:], "CUDA error")

    monkeypatch.setattr(steps, "measure_step", faulting)
    step = steps.Step(small, "fwd", [_spec("correct"), _spec("wrong")]).to_dict()
    settings = Settings(gate_seed=1).to_dict()
    messages = list(steps.child_run_steps([step, step], settings, device="cpu"))
    assert messages[0] == {"started": 0}
    assert messages[1]["retry"] == ["wrong"] and messages[1]["results"]["correct"]["status"] == "crash"
    assert len(messages) == 2  # the second step is left for a fresh process


def test_device_faults_are_recognised():
    assert steps._context_lost(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert steps._context_lost(RuntimeError("CUDA_ERROR_ILLEGAL_ADDRESS"))
    assert not steps._context_lost(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
