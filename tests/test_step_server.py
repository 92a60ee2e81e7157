"""fa4tune.harness.step_server: one child kept across calls (its references and experiment modules with it), and
crashes, hangs, device faults and wrong results that cost only their own step (CPU fakes, no GPU)."""

import os
import sys
from dataclasses import replace

import pytest

from fa4tune.config import Problem
from fa4tune.harness import candidates, evaluation, gpu, step_server
from fa4tune.harness.settings import ROOT, Settings
from fa4tune.harness.steps import Step
from fa4tune.targets import get_target

TARGETS = "tests.prepare_child_targets"
SMALL = Problem(1, 48, 48, 2, 2, 32, 32, True, backward=False, name="tiny causal")
SETTINGS = Settings(gate_seed=7, warmup=1, rounds=1, input_sets=1, gate_random_problems=1)
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(autouse=True)
def _keep_the_loaded_experiment(monkeypatch):
    """Two tests load a tiny experiment.py as module `experiment`; put the project's back after each (later tests'
    kernel registry reads that module)."""
    monkeypatch.setitem(sys.modules, "experiment", sys.modules.get("experiment"))


def spec(name):
    return {"name": name, "kind": "callable", "factory": f"{TARGETS}:{name}_candidate"}


def step(*names, problem=SMALL):
    return Step(problem, "fwd", [spec(n) for n in names])


def server(timeout_s=30.0, env=ENV, **options):
    return evaluation.new_step_server(env=env, device="cpu", timeout_s=timeout_s, **options)


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


def test_the_child_persists_across_calls_and_reuses_its_references(tmp_path):
    log = tmp_path / "references.log"
    with server(env={**ENV, "FA4TUNE_TEST_REFERENCE_LOG": str(log)}) as s:
        pid = s.pid
        assert os.getsid(pid) != os.getsid(0)  # its own session: a terminal Ctrl-C does not reach it
        (first,) = s.run_steps([step("counting")], SETTINGS)
        computed = log.read_text().split()
        # fp32 and plain, for each of 4 gate cases and each timed round's input set checked whole (issue 66: new values
        # every round)
        assert len(computed) == 2 * (4 + SETTINGS.rounds) and set(computed) == {str(pid)}
        # another candidate on the same cases, in a later call: the same child, no gate reference computed again
        (second,) = evaluation.run_steps_isolated([step("correct")], SETTINGS, server=s)
        assert s.pids == [pid] and s.pid == pid
        assert len(log.read_text().split()) == len(computed) + 2 * SETTINGS.rounds
        assert second["correct"].status == "ok" and second["correct"].max_errors == first["counting"].max_errors
        # another gate seed: other cases, other references
        s.run_steps([step("correct")], replace(SETTINGS, gate_seed=8))
        assert len(log.read_text().split()) == 2 * len(computed) + 2 * SETTINGS.rounds
    assert not alive(pid)  # close() ended it


def test_bad_candidates_cost_their_own_step_and_the_next_results_are_unchanged():
    steps = [
        step("correct", "segfault"),  # one child dies in it, and the step is split: only the segfault is marked
        step("hang"),
        step("correct"),
        step("context_lost"),  # the child retires after this step: a fresh one runs the next
        step("correct"),
        step("wrong"),
        step("correct"),
    ]
    seen = []
    with server(timeout_s=5.0) as s:
        results = s.run_steps(steps, SETTINGS, on_result=lambda st, name, r: seen.append((name, r.status)))
        # children: the first (segfault in the step of two), the one running the split candidates (segfault
        # again), the hang, the context loss, and the last one, which is still up for the next call
        assert len(s.pids) == 5 and s.pid == s.pids[-1]
        (after,) = s.run_steps([step("correct")], SETTINGS)
        assert s.pid == s.pids[-1] and len(s.pids) == 5
    statuses = [{name: r.status for name, r in one.items()} for one in results]
    assert statuses == [
        {"correct": "ok", "segfault": "crash"}, {"hang": "timeout"}, {"correct": "ok"}, {"context_lost": "crash"},
        {"correct": "ok"}, {"wrong": "incorrect"}, {"correct": "ok"},
    ]
    assert "SIGSEGV" in results[0]["segfault"].reason
    assert results[1]["hang"].reason.startswith("no progress")
    assert "CUDA error: an illegal memory access" in results[3]["context_lost"].reason
    assert "out max error" in results[5]["wrong"].reason and results[5]["wrong"].ms_median is None
    assert len(seen) == 8 and sorted(set(seen)) == sorted({(n, st) for one in statuses for n, st in one.items()})
    # nothing the bad candidates did reaches the others: the same gate errors as in a run without them
    with server() as clean:
        (alone,) = clean.run_steps([step("correct")], SETTINGS)
    for one in [results[0], results[2], results[4], results[6], after]:
        assert one["correct"].max_errors == alone["correct"].max_errors and one["correct"].tflops > 0


def test_a_child_that_cannot_start_charges_each_step_with_the_reason():
    s = step_server.StepServer(env=ENV, device="cpu", cwd=str(ROOT), sys_path=[str(ROOT)], timeout_s=5.0,
                               startup_timeout_s=30.0, preload=["no_such_module_here"])
    with s:
        results = s.run_steps([step("correct"), step("correct")], SETTINGS)
    assert [r["correct"].status for r in results] == ["crash", "crash"]
    assert all("ModuleNotFoundError: No module named 'no_such_module_here'" in r["correct"].reason for r in results)


def test_a_changed_experiment_file_is_loaded_again_and_an_unchanged_one_is_kept(tmp_path):
    path = tmp_path / "experiment.py"
    source = (
        "from fa4tune import defaults\n"
        "from tests.prepare_child_targets import torch_attention\n"
        "forward_config = defaults.upstream_forward\n"
        "backward_config = defaults.upstream_backward\n"
        "FACTOR = {factor}\n"
        "def attention(q, k, v, causal=False, **kw):\n"
        "    out, lse = torch_attention(q, k, v, causal, return_lse=True)\n"
        "    return out * FACTOR, lse\n"
    )
    path.write_text(source.format(factor=1.0))
    problem = Problem(1, 64, 64, 2, 2, 64, 64, True, backward=False, name="tiny d64")
    module = candidates.load_experiment(path)
    assert candidates.load_experiment(path) is module  # unchanged: the same module (and its compile caches)
    pc = problem.problem_class
    experiment = Step(problem, "fwd", [candidates.experiment_spec("experiment", path, module.forward_config(pc), module.backward_config(pc))])
    with server() as s:
        (before,) = s.run_steps([experiment], SETTINGS)
        path.write_text(source.format(factor=1.5))
        (after,) = s.run_steps([experiment], SETTINGS)
        assert len(s.pids) == 1
    assert before["experiment"].status == "ok"
    assert after["experiment"].status == "incorrect"  # the child ran the new source, not its loaded module
    reloaded = candidates.load_experiment(path)
    assert reloaded is not module and reloaded.FACTOR == 1.5


def test_evaluate_isolated_uses_the_given_server_and_prunes_past_the_give_up_threshold(tmp_path, monkeypatch):
    path = tmp_path / "experiment.py"
    path.write_text(
        "from fa4tune import defaults\n"
        "from tests.prepare_child_targets import torch_attention as attention\n"
        "forward_config = defaults.upstream_forward\n"
        "backward_config = defaults.upstream_backward\n"
    )
    monkeypatch.setattr(gpu, "read_device", lambda index=0: gpu.DeviceInfo("cpu (test)", (0, 0), 1))
    monkeypatch.setattr(gpu, "select_mode", lambda info, target: "cpu")
    problems = [Problem(1, 64, 64, 2, 2, 64, 64, True, backward=False, name="a"), Problem(1, 80, 80, 2, 2, 64, 64, True, backward=False, name="b")]
    module = candidates.load_experiment(path)
    config = module.forward_config(problems[0].problem_class)
    settings = replace(SETTINGS, rounds=3, input_sets=2)
    with server() as s:
        m = evaluation.evaluate_isolated("fwd", config, problems, path, target=get_target("sm120"), settings=settings, server=s,
                                      give_up_ms={problems[1].label: 1e-9})
        pid = s.pid
        again = evaluation.evaluate_isolated("fwd", config, problems[:1], path, target=get_target("sm120"), settings=settings, server=s)
        assert s.pids == [pid]
    ok, pruned = m.results
    assert ok.status == "ok" and again.results[0].status == "ok"
    assert pruned.status == "pruned" and pruned.tflops > 0 and pruned.ms_median > 0
    assert pruned.reason.startswith("stopped after 2 samples: median") and "> 1e-09 ms (give-up threshold)" in pruned.reason
