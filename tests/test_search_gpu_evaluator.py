"""The GPU evaluator's CPU side: each config's sm_120a static facts first, and no GPU time for a config they end.
The harness call (fa4tune.harness.evaluation.evaluate_isolated) is replaced by a recorder: CI has no GPU."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from fa4tune.config import ForwardConfig, ProblemClass
from fa4tune.defaults import upstream_forward
from fa4tune.harness.measurement import Measurement, ProblemResult
from fa4tune.suites import load_suite
from fa4tune.targets import get_target
from search.evaluating.gpu import GpuEvaluator

TARGET = get_target("sm120")


class FakeHarness:
    """fa4tune.harness.evaluation.evaluate_isolated as a GPU would answer it; remembers what reached it."""

    def __init__(self):
        self.calls = []

    def __init__(self, tflops: float = 100.0):
        self.calls, self.limits, self.tflops = [], [], tflops
        self.server = _FakeServer()

    def new_step_server(self, **options):
        return self.server

    def evaluate_isolated(self, kind, config, problems, experiment_path, target, settings, server, give_up_ms=None):
        assert server is self.server and len(problems) == 1  # one problem at a time, in the run's server
        self.calls.append(config)
        self.limits.append(give_up_ms)
        limit = (give_up_ms or {}).get(problems[0].label)
        status = "pruned" if limit else "ok"
        results = tuple(ProblemResult(p.label, kind, status, tflops=self.tflops) for p in problems)
        return Measurement(kind, problems[0].problem_class.name, config.to_dict(), results, target.name, "fake GPU", "emulated",
                           evaluator="gpu")


class _FakeServer:
    closed = False

    def close(self):
        self.closed = True


class _Monitor:
    """search.evaluating.pruning.TrialMonitor's interface: a give-up time for the second problem; stops on a pruned result."""

    def __init__(self, limits):
        self.limits, self.reported = limits, []

    def give_up_ms(self, label):
        return self.limits.get(label)

    def report(self, result):
        self.reported.append(result.status)
        return result.status != "pruned"


def test_problems_go_one_at_a_time_to_the_runs_server_and_a_pruned_one_ends_the_config(tmp_path, monkeypatch):
    evaluator, harness = _evaluator(tmp_path)
    monkeypatch.setattr(evaluator, "static_facts", lambda *args: {"status": "ok", "arch": "sm_120a"})
    problems = [p for p in load_suite("standard") if p.problem_class.name == "d128-noncausal-bf16"][:3]
    assert len(problems) == 3
    monitor = _Monitor({problems[1].label: 1.5})
    m = evaluator.evaluate("fwd", ForwardConfig(), problems[0].problem_class, problems, monitor=monitor)
    assert [r.status for r in m.results] == ["ok", "pruned", "pruned"] and monitor.reported == ["ok", "pruned"]
    assert "not measured" in m.results[2].reason and m.results[2].tflops is None
    assert harness.limits == [None, {problems[1].label: 1.5}]  # the third problem never reached the GPU
    evaluator.close()
    assert harness.server.closed


def _evaluator(tmp_path) -> tuple[GpuEvaluator, FakeHarness]:
    evaluator = GpuEvaluator(TARGET, static_cache=tmp_path / "facts.jsonl")
    evaluator._harness = harness = FakeHarness()
    return evaluator, harness


def _problems(name: str):
    return [p for p in load_suite("quick") if p.problem_class.name == name]


@pytest.mark.compile
def test_every_gpu_measurement_carries_the_exact_sm120a_facts_of_its_kernel(tmp_path):
    evaluator, harness = _evaluator(tmp_path)
    pc = ProblemClass.parse("d64-noncausal-bf16")
    config = upstream_forward(pc)
    m = evaluator.evaluate("fwd", config, pc, _problems(pc.name))
    assert harness.calls == [config] and m.ok and m.device == "fake GPU"
    assert m.static["arch"] == "sm_120a" and m.static["status"] == "ok"
    assert m.static["registers"] > 0 and m.static["dynamic_smem_bytes"] > 0 and m.static["occupancy"] > 0
    again = evaluator.evaluate("fwd", config, pc, _problems(pc.name))  # from the facts cache: no second compile
    assert again.static["cached"] and again.static["registers"] == m.static["registers"]


def test_a_config_the_static_check_ends_costs_no_gpu_time(tmp_path):
    evaluator, harness = _evaluator(tmp_path)
    pc = ProblemClass.parse("d128-causal-gqa4-bf16")
    config = ForwardConfig(tile_m=256, tile_n=32, num_threads=128, num_stages=1, Q_in_regs=False)  # PackGQA: tile_m > threads
    m = evaluator.evaluate("fwd", config, pc, _problems(pc.name))
    assert harness.calls == []
    assert m.status == "infeasible" and "pack_gqa_tile_m_le_num_threads" in m.reason
    assert [r.problem for r in m.results] == [p.label for p in _problems(pc.name)]


def test_a_broken_static_check_leaves_the_gpu_measurement_standing(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr("fa4tune.static_check.StaticChecker.check", broken)
    evaluator, harness = _evaluator(tmp_path)
    pc = ProblemClass.parse("d64-noncausal-bf16")
    m = evaluator.evaluate("fwd", upstream_forward(pc), pc, _problems(pc.name))
    assert len(harness.calls) == 1 and m.ok
    assert m.static == {"status": "static_error", "reason": "OSError: No space left on device", "arch": "sm_120a"}


@pytest.mark.compile
def test_a_kernel_whose_cubin_cannot_be_read_is_not_called_a_compile_error_and_still_reaches_the_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("FA4TUNE_CUOBJDUMP", str(tmp_path / "no-cuobjdump"))  # the compile workers inherit it
    evaluator, harness = _evaluator(tmp_path)
    pc = ProblemClass.parse("d64-noncausal-bf16")
    m = evaluator.evaluate("fwd", upstream_forward(pc), pc, _problems(pc.name))
    assert len(harness.calls) == 1 and m.ok
    assert m.static["status"] == "static_error" and "cuobjdump not found" in m.static["reason"], m.static
    assert not (tmp_path / "facts.jsonl").exists()  # an environment's failure is not cached as the config's fact


@pytest.mark.compile
def test_the_static_compile_worker_is_started_once_for_all_trials(tmp_path):
    evaluator, harness = _evaluator(tmp_path)
    pc = ProblemClass.parse("d64-noncausal-bf16")
    try:
        evaluator.evaluate("fwd", ForwardConfig(128, 64, 128, 1, False), pc, _problems(pc.name))
        first = evaluator._checker.slots[0].proc.proc.pid
        m = evaluator.evaluate("fwd", ForwardConfig(64, 64, 128, 1, False), pc, _problems(pc.name))
        assert not m.static["cached"] and m.static["registers"] > 0  # compiled, by the same process
        assert [w.proc.proc.pid for w in evaluator._checker.slots] == [first]
    finally:
        evaluator.close()
    assert evaluator._checker is None


@pytest.mark.compile
def test_trials_in_flight_on_several_threads_each_get_their_own_kernels_facts(tmp_path):
    evaluator, harness = _evaluator(tmp_path)
    pc = ProblemClass.parse("d64-noncausal-bf16")
    configs = [ForwardConfig(128, 64, 128, 1, False), ForwardConfig(128, 64, 256, 1, False)]
    try:
        evaluator.evaluate("fwd", ForwardConfig(64, 64, 128, 1, False), pc, _problems(pc.name))  # its compile worker is up
        harness.calls.clear()
        with ThreadPoolExecutor(2) as pool:  # `search worker --slots 2` without --compile-jobs: one checker, two threads
            found = list(pool.map(lambda c: evaluator.evaluate("fwd", c, pc, _problems(pc.name)), configs))
    finally:
        evaluator.close()
    assert sorted(map(str, harness.calls)) == sorted(map(str, configs))
    assert [m.static["status"] for m in found] == ["ok", "ok"]
    assert [m.static["num_threads"] for m in found] == [128, 256] and all(m.static["registers"] > 0 for m in found)


class _RoundServer:
    """The step server as the pipelined evaluator's consumer calls it: records each call's steps; a step whose
    give-up time is set comes back pruned."""

    def __init__(self):
        self.calls = []

    def run_steps(self, steps, settings):
        self.calls.append([(s.specs[0]["name"], s.problem.label, s.give_up_ms) for s in steps])
        return [{s.specs[0]["name"]: ProblemResult(s.problem.label, s.direction, "pruned" if s.give_up_ms else "ok", tflops=50.0)}
                for s in steps]


def test_the_pipelined_consumer_sends_each_candidates_next_problem_per_round_and_drops_a_pruned_one():
    from fa4tune.harness import candidates, evaluation
    from fa4tune.harness.settings import EXPERIMENT_PATH, Settings
    from search.evaluating.gpu_pipeline import PipelinedGpuEvaluator, compile_job
    from search.evaluating.pipeline import Ready

    problems = [p for p in load_suite("standard") if p.problem_class.name == "d128-noncausal-bf16"]
    evaluator = object.__new__(PipelinedGpuEvaluator)  # the consumer's half alone: no GPU, no compilers
    evaluator._harness, evaluator.target, evaluator.experiment_path = evaluation, TARGET, str(EXPERIMENT_PATH)
    evaluator._experiment, evaluator.settings = candidates.load_experiment(EXPERIMENT_PATH), Settings(gate_seed=1)
    evaluator.server = _RoundServer()
    configs = [ForwardConfig(), ForwardConfig(tile_n=64)]
    monitors = [_Monitor({}), _Monitor({problems[1].label: 2.0})]
    batch = [Ready(compile_job("fwd", c, problems, TARGET, evaluator.experiment_path, 1, 2, "sm_90a"), {"status": "ok"}, 0.0, payload=m)
             for c, m in zip(configs, monitors)]
    finished = {}
    evaluator._evaluate_batch(batch, lambda item, results: finished.setdefault(batch.index(item), [r.status for r in results]))
    assert finished == {0: ["ok", "ok", "ok"], 1: ["ok", "pruned", "pruned"]}
    labels = [p.label for p in problems]
    assert evaluator.server.calls == [  # one call per round; the pruned candidate's third problem never sent
        [("candidate 0", labels[0], None), ("candidate 1", labels[0], None)],
        [("candidate 0", labels[1], None), ("candidate 1", labels[1], 2.0)],
        [("candidate 0", labels[2], None)],
    ]
