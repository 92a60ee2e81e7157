"""Real sm_120a compiles (CUTLASS DSL, fake tensors, no GPU): registers, spills, knobs, cache keys."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fa4tune.config import BackwardConfig, ForwardConfig, ProblemClass
from fa4tune.static_check import StaticJob, cache_key, run_static
from fa4tune.targets import get_target

ROOT = Path(__file__).resolve().parent.parent
TARGET = get_target("sm120")
D128_CAUSAL = ProblemClass(128, 128, True)
UPSTREAM_FWD = ForwardConfig(tile_m=128, tile_n=64, num_threads=128, num_stages=1, Q_in_regs=False)
FWD_256 = ForwardConfig(tile_m=128, tile_n=64, num_threads=256, num_stages=1, Q_in_regs=False)
FWD_2STAGE = ForwardConfig(tile_m=128, tile_n=64, num_threads=128, num_stages=2, Q_in_regs=False)
BWD_DEFAULT = BackwardConfig()
BWD_256 = BackwardConfig(m_block_size=128, n_block_size=64, num_threads=256, AtomLayoutMSdP=4, AtomLayoutNdKV=4, AtomLayoutMdQ=4)

pytestmark = pytest.mark.compile


@pytest.fixture(scope="module")
def facts(tmp_path_factory):
    jobs = [
        StaticJob("fwd", UPSTREAM_FWD, D128_CAUSAL),
        StaticJob("fwd", FWD_256, D128_CAUSAL),
        StaticJob("fwd", FWD_2STAGE, D128_CAUSAL),
        StaticJob("bwd", BWD_DEFAULT, D128_CAUSAL),
        StaticJob("fwd", ForwardConfig(tile_m=128, tile_n=128, num_threads=128, num_stages=2), ProblemClass(128, 128, False)),
    ]
    cache = tmp_path_factory.mktemp("cache") / "facts.jsonl"
    results = run_static(jobs, TARGET, ROOT / "experiment.py", workers=1, cache_path=cache)
    return dict(zip(["upstream", "t256", "stage2", "bwd", "over99k"], results)), jobs, cache


def test_upstream_default_causal_d128_spills(facts):
    # Recorded 2026-11-29 (flash-attn-4 4.0.0b36, nvidia-cutlass-dsl 4.8.1): the upstream default
    # SM120 forward for head_dim 128 causal hits the 255-register ceiling and spills.
    f = facts[0]["upstream"]
    assert f.status == "ok"
    assert f.registers == 255
    assert f.stack_bytes == 160
    assert f.spill_store_bytes > 0 and f.spill_load_bytes > 0
    assert f.dynamic_smem_bytes == 65536  # Q 32 KB + K 16 KB + V 16 KB
    assert f.blocks_per_sm == 1 and f.occupancy_limiter == "smem"


def test_256_threads_same_tile_does_not_spill(facts):
    f = facts[0]["t256"]
    assert f.status == "ok"
    assert f.registers == 236
    assert f.stack_bytes == 0 and f.spill_store_bytes == 0 and f.spill_load_bytes == 0


def test_num_stages_reaches_kernel_shared_memory(facts):
    assert facts[0]["stage2"].dynamic_smem_bytes == 98304  # two K/V stages
    assert facts[0]["upstream"].dynamic_smem_bytes == 65536


def test_backward_default_compiles(facts):
    f = facts[0]["bwd"]
    # also at the register ceiling; its shared storage (LSE, dPsum, P/dS tiles) exceeds upstream's formula
    assert f.status == "ok" and f.registers == 255 and f.stack_bytes == 168
    assert f.dynamic_smem_bytes == 82944


def test_infeasible_config_is_not_compiled(facts):
    f = facts[0]["over99k"]
    assert f.status == "infeasible" and f.reason.startswith("smem_capacity: needs 163840 B")
    assert f.compile_seconds == 0


def test_cache_serves_second_run_and_keys_differ_by_every_knob(facts):
    _, jobs, cache = facts
    again = run_static(jobs[:3], TARGET, ROOT / "experiment.py", workers=1, cache_path=cache)
    assert all(f.cached for f in again)
    assert [f.registers for f in again] == [facts[0]["upstream"].registers, facts[0]["t256"].registers, facts[0]["stage2"].registers]
    keys = {cache_key(job, TARGET, str(ROOT / "experiment.py")) for job in jobs}
    assert len(keys) == len(jobs)


def test_knobs_reach_the_constructed_kernels_and_compile_keys_do_not_collide(tmp_path):
    jobs = [
        {"kind": "fwd", "head_dim": 128, "causal": True, "config": UPSTREAM_FWD.to_dict()},
        {"kind": "fwd", "head_dim": 128, "causal": True, "config": FWD_2STAGE.to_dict()},  # differs only in num_stages
        {"kind": "fwd", "head_dim": 128, "causal": True, "config": {**FWD_256.to_dict(), "Q_in_regs": True}},
        {"kind": "bwd", "head_dim": 128, "causal": True, "gqa": 2, "config": BWD_256.to_dict()},
        {"kind": "bwd", "head_dim": 64, "causal": False, "config": BackwardConfig(
            m_block_size=64, n_block_size=128, num_stages_Q=2, num_stages_dO=1, num_threads=256, SdP_swapAB=False,
            dKV_swapAB=False, dQ_swapAB=False, AtomLayoutMSdP=2, AtomLayoutNdKV=4, AtomLayoutMdQ=2, V_in_regs=True).to_dict()},
    ]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "compile_probe.py"), str(tmp_path)], input=json.dumps(jobs),
        capture_output=True, text=True, timeout=600,
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE ")), None)
    assert line, proc.stderr[-3000:]
    report = json.loads(line[len("PROBE "):])
    for job, seen in zip(jobs, report["jobs"]):
        for knob, value in job["config"].items():
            if knob != "kernel":
                assert seen["kernel"][knob] == value, (knob, job, seen)
        assert seen["new_compiles"] == 1, "each config must compile its own kernel"
        assert seen["reqntid"] == [job["config"]["num_threads"]]
    assert report["fwd_cache"] == 3 and report["bwd_cache"] == 2


def test_a_kept_checker_reuses_its_worker_and_restarts_it_when_experiment_py_changes(tmp_path):
    from fa4tune.static_check import StaticChecker

    experiment = tmp_path / "experiment.py"
    experiment.write_text((ROOT / "experiment.py").read_text())
    d64 = ProblemClass(64, 64, False)
    with StaticChecker(TARGET, experiment, workers=1, cache_path=None) as checker:
        first = checker.check([StaticJob("fwd", UPSTREAM_FWD, d64)])[0]
        pid = checker.slots[0].proc.proc.pid
        second = checker.check([StaticJob("fwd", FWD_256, d64)])[0]
        assert checker.slots[0].proc.proc.pid == pid and first.ok and second.ok
        experiment.write_text(experiment.read_text() + "\n# edited\n")
        third = checker.check([StaticJob("fwd", FWD_2STAGE, d64)])[0]
        assert third.ok and checker.slots[0].proc.proc.pid != pid  # the worker had loaded the old experiment.py
