"""The compile stage with real sm_120a compiles (CPU, fake tensors): a kernel compiled by one compiler process
is loaded, not compiled, by a fresh process (as the GPU process does), with its static facts; a candidate that
does not compile ends in the compile stage."""

from __future__ import annotations

import pytest

from fa4tune.config import ForwardConfig
from fa4tune.defaults import upstream_forward
from fa4tune.suites import load_suite
from fa4tune.targets import get_target
from search.evaluating.gpu_pipeline import COMPILE_FUNCTION, compile_env, compile_job
from search.evaluating.pipeline import CompilePool
from search_helpers import ROOT

TARGET = get_target("sm120")


def _jobs(class_name: str, config: ForwardConfig) -> dict:
    problems = [p for p in load_suite("quick") if p.problem_class.name == class_name]
    return compile_job("fwd", config, problems, TARGET, str(ROOT / "experiment.py"), gate_seed=7, gate_random_problems=1, arch="sm_120a")


@pytest.mark.compile
def test_a_kernel_compiled_in_one_process_is_loaded_by_the_next_and_compile_errors_stay_in_the_compile_stage(tmp_path):
    env = compile_env(TARGET, (12, 0), TARGET.num_sms, tmp_path / "kernels")
    good = _jobs("d64-noncausal-bf16", upstream_forward(load_suite("quick")[2].problem_class))
    # PackGQA asserts at compile time on tile_m=256 with 128 threads (a static rule now; the compile stage does not need it)
    bad = _jobs("d128-causal-gqa4-bf16", ForwardConfig(tile_m=256, tile_n=32, num_threads=128, num_stages=1, Q_in_regs=False))

    first = CompilePool(COMPILE_FUNCTION, 1, env, timeout_s=600)
    try:
        compiled = first.submit(good).result()
        failed = first.submit(bad).result()
    finally:
        first.close()
    assert compiled["status"] == "ok", compiled
    assert compiled["kernels_compiled"] >= 1 and compiled["kernels_loaded"] == 0
    static = compiled["static"]
    assert static["registers"] > 0 and static["dynamic_smem_bytes"] > 0 and static["arch"] == "sm_120a"
    assert failed["status"] == "compile_error" and failed["reason"]

    second = CompilePool(COMPILE_FUNCTION, 1, env, timeout_s=600)  # a fresh process, as the GPU child is
    try:
        again = second.submit(good).result()
    finally:
        second.close()
    assert again["status"] == "ok", again
    assert again["kernels_compiled"] == 0 and again["kernels_loaded"] >= 1
    assert again["static"] == static


@pytest.mark.compile
def test_a_kernel_whose_cubin_cannot_be_read_still_goes_to_the_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("FA4TUNE_CUOBJDUMP", str(tmp_path / "no-cuobjdump"))  # the compile process inherits it
    env = compile_env(TARGET, (12, 0), TARGET.num_sms, tmp_path / "kernels")
    pool = CompilePool(COMPILE_FUNCTION, 1, env, timeout_s=600)
    try:
        compiled = pool.submit(_jobs("d64-noncausal-bf16", upstream_forward(load_suite("quick")[2].problem_class))).result()
    finally:
        pool.close()
    assert compiled["status"] == "ok", compiled
    assert compiled["static"]["status"] == "static_error" and "cuobjdump not found" in compiled["static"]["reason"]
