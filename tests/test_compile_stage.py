"""The compile pipeline's compile stage: the sm_120a static check, then the compile for the GPU's arch; one compile
when the GPU's arch is sm_120a. Fake compiler pools for the rules; one real compile for the shared-memory figure."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from fa4tune.config import ForwardConfig
from fa4tune.defaults import upstream_forward
from fa4tune.static_check import FactsCache, StaticJob, cache_key, facts_from_compile, run_static
from fa4tune.suites import load_suite
from fa4tune.targets import get_target
from search.evaluating.compile_stage import CompileStage
from search.evaluating.gpu_pipeline import compile_env, compile_job
from search_helpers import ROOT

TARGET = get_target("sm120")
EXPERIMENT = str(ROOT / "experiment.py")
PROBLEMS = [p for p in load_suite("quick") if p.problem_class.name == "d64-noncausal-bf16"]
PC = PROBLEMS[0].problem_class
CONFIG = upstream_forward(PC)
KERNEL = dict(registers=200, stack_bytes=0, spill_store_bytes=0, spill_load_bytes=0, static_smem_bytes=1024,
              dynamic_smem_bytes=49152, declared_smem_bytes=49152, compile_seconds=3.0)


def _job(config=CONFIG, gpu_arch="sm_120a") -> dict:
    return compile_job("fwd", config, PROBLEMS, TARGET, EXPERIMENT, gate_seed=7, gate_random_problems=1, arch=gpu_arch)


def _facts(config=CONFIG, arch="sm_120a", **kernel) -> dict:
    facts = facts_from_compile(StaticJob("fwd", config, PC), TARGET, "ok", kernel={**KERNEL, **kernel})
    return {**facts.to_dict(), "arch": arch}


class FakePool:
    """A compiler pool that answers at once with `answer(job)` and remembers the jobs."""

    def __init__(self, answer):
        self.answer, self.jobs, self.closed = answer, [], False

    def submit(self, job: dict) -> Future:
        self.jobs.append(job)
        future: Future = Future()
        future.set_result(self.answer(job))
        return future

    def close(self) -> None:
        self.closed = True


def _gpu_stage(arch: str, **kernel):
    """The GPU stage's answer: its compile of the gate shapes, with its first kernel's facts for `arch`."""
    static = _facts(arch=arch, **kernel)
    status = "infeasible" if static["status"] == "infeasible" else "ok"
    return FakePool(lambda job: {"status": status, "reason": static["reason"], "arch": arch, "shapes": 4,
                                 "kernels_compiled": 1, "kernels_loaded": 0, "static": static})


def _static_stage(reply: dict):
    return FakePool(lambda spec: reply)


def test_on_an_sm120a_gpu_one_compile_gives_the_static_facts_and_fills_the_static_checks_cache(tmp_path):
    gpu, static = _gpu_stage("sm_120a", registers=232), _static_stage({"status": "ok", "reason": "", "kernel": KERNEL})
    facts = FactsCache(tmp_path / "facts.jsonl")
    stage = CompileStage(TARGET, "sm_120a", gpu, static, facts)

    first = stage.compile_candidate(_job())
    assert len(gpu.jobs) == 1 and static.jobs == []  # the GPU's compile is the static check's
    assert first["status"] == "ok" and first["compile"]["kernels_compiled"] == 1
    assert first["static"]["registers"] == 232 and first["static"]["arch"] == "sm_120a" and not first["static"]["cached"]
    key = cache_key(StaticJob("fwd", CONFIG, PC), TARGET, EXPERIMENT)
    assert FactsCache(tmp_path / "facts.jsonl").get(key).registers == 232  # what the static check will find

    again = stage.compile_candidate(_job())
    assert len(gpu.jobs) == 2 and static.jobs == []  # the kernel cache serves the GPU stage; still no second compile
    assert again["static"]["cached"] and again["static"]["registers"] == 232
    stage.close()
    assert gpu.closed


def test_on_an_sm120a_gpu_compiled_shared_storage_over_capacity_is_cached_and_not_compiled_again(tmp_path):
    gpu = _gpu_stage("sm_120a", dynamic_smem_bytes=110592, declared_smem_bytes=110592)
    stage = CompileStage(TARGET, "sm_120a", gpu, None, FactsCache(tmp_path / "facts.jsonl"))
    first = stage.compile_candidate(_job())
    assert first["status"] == "infeasible" and "smem_capacity_compiled" in first["reason"]
    again = stage.compile_candidate(_job())
    assert len(gpu.jobs) == 1 and again["status"] == "infeasible" and again["compile"] is None


def test_on_another_gpu_the_static_check_and_the_gpu_compile_are_two_compiles(tmp_path):
    gpu = _gpu_stage("sm_90a", registers=168)
    static = _static_stage({"status": "ok", "reason": "", "kernel": {**KERNEL, "registers": 255}})
    stage = CompileStage(TARGET, "sm_90a", gpu, static, FactsCache(tmp_path / "facts.jsonl"))
    result = stage.compile_candidate(_job(gpu_arch="sm_90a"))
    assert len(static.jobs) == 1 and len(gpu.jobs) == 1
    assert static.jobs[0]["config"] == CONFIG.to_dict() and static.jobs[0]["experiment_path"] == EXPERIMENT
    assert result["status"] == "ok"
    assert result["static"]["registers"] == 255 and result["static"]["arch"] == "sm_120a"  # SM120's facts, not the H200's
    assert result["compile"]["arch"] == "sm_90a" and "static" not in result["compile"]
    assert gpu.jobs[0]["read_facts"] is False  # another arch's registers and spills: not read

    stage.compile_candidate(_job(gpu_arch="sm_90a"))
    assert len(static.jobs) == 1 and len(gpu.jobs) == 2  # the static stage is cached under every knob, the GPU stage is not
    assert gpu.jobs[1]["read_facts"] is False  # also when the static facts came from the cache


def test_on_another_gpu_a_static_check_that_ends_the_candidate_skips_the_gpu_compile(tmp_path):
    for reply, status in [
        ({"status": "compile_error", "reason": "DSLRuntimeError: bad layout"}, "compile_error"),
        ({"status": "ok", "reason": "", "kernel": {**KERNEL, "dynamic_smem_bytes": 110592, "declared_smem_bytes": 110592}}, "infeasible"),
    ]:
        gpu = _gpu_stage("sm_90a")
        stage = CompileStage(TARGET, "sm_90a", gpu, _static_stage(reply), FactsCache(None))
        result = stage.compile_candidate(_job(gpu_arch="sm_90a"))
        assert gpu.jobs == [] and result["status"] == status and result["compile"] is None


def test_a_static_check_that_timed_out_or_read_no_cubin_leaves_the_candidate_to_the_gpu_and_is_not_cached(tmp_path):
    for reply, status in [
        ({"status": "compile_error", "reason": "compile ran past 300 s and was killed", "timed_out": True}, "compile_timeout"),
        ({"status": "static_error", "reason": "compiled, but its cubin could not be read: cuobjdump not found"}, "static_error"),
    ]:
        gpu, static = _gpu_stage("sm_90a"), _static_stage(reply)
        stage = CompileStage(TARGET, "sm_90a", gpu, static, FactsCache(tmp_path / "facts.jsonl"))
        result = stage.compile_candidate(_job(gpu_arch="sm_90a"))
        assert result["status"] == "ok" and result["static"]["status"] == status and len(gpu.jobs) == 1
        assert not (tmp_path / "facts.jsonl").exists()


def test_a_config_the_static_rules_reject_compiles_nowhere(tmp_path):
    gpu, static = _gpu_stage("sm_90a"), _static_stage({})
    stage = CompileStage(TARGET, "sm_90a", gpu, static, FactsCache(None))
    too_big = ForwardConfig(tile_m=128, tile_n=128, num_threads=128, num_stages=2, Q_in_regs=False)  # 163840 B for d128
    problems = [p for p in load_suite("quick") if p.problem_class.head_dim == 128 and p.problem_class.qhead_per_kvhead == 1]
    result = stage.compile_candidate(compile_job("fwd", too_big, problems[:1], TARGET, EXPERIMENT, 7, 1, "sm_90a"))
    assert result["status"] == "infeasible" and result["reason"].startswith("smem_capacity") and gpu.jobs == static.jobs == []


def test_a_gpu_whose_arch_is_not_the_targets_needs_a_static_pool():
    with pytest.raises(ValueError, match="sm_90a"):
        CompileStage(TARGET, "sm_90a", _gpu_stage("sm_90a"), None, FactsCache(None))


@pytest.mark.compile
def test_the_static_check_and_the_compile_pipeline_record_the_same_shared_memory_for_a_config(tmp_path):
    facts_path = tmp_path / "facts.jsonl"
    env = compile_env(TARGET, (12, 0), TARGET.num_sms, tmp_path / "kernels")
    stage = CompileStage.open(TARGET, "sm_120a", env, jobs=1, cache_path=facts_path, timeout_s=600)
    try:
        compiled = stage.compile_candidate(_job())
    finally:
        stage.close()
    assert compiled["status"] == "ok", compiled
    static = run_static([StaticJob("fwd", CONFIG, PC)], TARGET, EXPERIMENT, workers=1, cache_path=None)[0]  # its own compile
    assert static.ok, static
    assert compiled["static"]["dynamic_smem_bytes"] == static.dynamic_smem_bytes == 49152  # Q 16 KB + K 16 KB + V 16 KB
    assert compiled["static"]["registers"] == static.registers and compiled["static"]["stack_bytes"] == static.stack_bytes
    served = run_static([StaticJob("fwd", CONFIG, PC)], TARGET, EXPERIMENT, workers=1, cache_path=facts_path)[0]
    assert served.cached and served.dynamic_smem_bytes == 49152  # the pipeline's one compile served the static check


def test_a_compile_that_needs_no_facts_reads_no_cubin(tmp_path):
    """read_facts=False (the GPU stage under emulation): the kernel compiles, its shared storage is still recorded,
    the cubin is never read and the facts say so. A real sm_120a compile, in a subprocess."""
    import json
    import subprocess
    import sys

    probe = """
import sys, json
import probe_env
import fa4tune.cubin as cubin
calls = []
cubin.read_cubin = lambda data: calls.append(len(data))
import experiment
from fa4tune.config import ForwardConfig, Problem
from fa4tune.fake_compile import compile_shapes
config, problem = ForwardConfig.from_dict(json.loads(sys.argv[2])), Problem.from_dict(json.loads(sys.argv[3]))
facts = compile_shapes(experiment, "fwd", config, [problem], read_facts=False)
print(json.dumps({"facts": facts.resources(), "error": facts.cubin_error, "compiled": facts.kernels_compiled, "reads": calls}))
"""
    out = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "dump"), json.dumps(CONFIG.to_dict()),
                          json.dumps(PROBLEMS[0].to_dict())], cwd=ROOT / "tests", capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["compiled"] == 1 and report["reads"] == []
    assert report["facts"]["dynamic_smem_bytes"] == 49152 and report["facts"]["registers"] == 0
    assert report["error"].startswith("not read")

