"""experiment.py's backward classes that fix an upstream bug (issue 44 item 3). sm120_vregs: upstream's V_in_regs
lays Q over V's shared memory but its dP gemm reads V from there; this class reads V from registers, is exempt from
that one rule, drops sV and counts the bytes it saves. sm120_cmask: a causal mask by each element's coordinates, so
causal S/dP MMAs may put warps along n (8 warps on a 64x64 tile)."""

import subprocess
import sys
from pathlib import Path

import pytest

import experiment
from fa4tune.config import BackwardConfig, ProblemClass
from fa4tune.feasibility import GATE_RULES, check_backward
from fa4tune.kernel_class import backward_kernels
from fa4tune.static_check import StaticJob, run_static
from fa4tune.targets import get_target
from kernels.backward_sm120 import BackwardSm120
from search.space import BACKWARD_DOMAIN, backward_space

TARGET = get_target("sm120")
D64 = ProblemClass(64, 64, False)
D128 = ProblemClass(128, 128, False)
BASE = BackwardConfig(m_block_size=64, n_block_size=64, num_stages_Q=2, num_stages_dO=2, AtomLayoutMSdP=2,
                      AtomLayoutNdKV=2, AtomLayoutMdQ=2)
OURS = BackwardConfig(**{**BASE.to_dict(), "kernel": "sm120_vregs", "V_in_regs": True})


def test_the_wrong_gradients_rule_binds_upstream_s_class_and_not_ours():
    upstream = check_backward(BackwardConfig(**{**BASE.to_dict(), "V_in_regs": True}), D64, TARGET)
    assert not upstream.ok and upstream.rule == "V_in_regs_wrong_gradients"
    assert check_backward(OURS, D64, TARGET).ok
    assert experiment.RegistersVBackwardSm120.fixes <= GATE_RULES
    assert experiment.kernel_class(OURS) is experiment.RegistersVBackwardSm120
    assert "sm120_vregs" not in backward_space(backward_kernels(experiment)).domain["kernel"]  # unmeasured: not searched


def test_v_in_registers_frees_v_s_tile_and_opens_two_stages_at_d128_64x64():
    saved = 64 * 128 * 2
    total, breakdown = experiment.RegistersVBackwardSm120.smem_bytes(OURS, D128)
    assert total == BackwardSm120.smem_bytes(BASE, D128)[0] - saved and "V in registers" in breakdown
    assert experiment.RegistersVBackwardSm120.smem_bytes(BASE, D128) == BackwardSm120.smem_bytes(BASE, D128)
    assert not check_backward(BASE, D128, TARGET).ok  # upstream's struct: 115,712 B
    assert check_backward(OURS, D128, TARGET).ok and total <= TARGET.smem_per_block


def test_a_class_that_names_an_unknown_rule_is_refused(monkeypatch):
    monkeypatch.setattr(experiment.RegistersVBackwardSm120, "fixes", frozenset({"no_such_rule"}))
    verdict = check_backward(OURS, D64, TARGET)
    assert not verdict.ok and verdict.rule == "fixes_known" and "no_such_rule" in verdict.message


@pytest.mark.compile
def test_it_compiles_for_sm120a_with_the_shared_memory_its_formula_says(tmp_path):
    [ours] = run_static([StaticJob("bwd", OURS, D64)], TARGET, experiment.__file__, workers=1,
                        cache_path=tmp_path / "facts.jsonl")  # upstream's formula: checked against its compiles elsewhere
    assert ours.status == "ok", ours.reason
    assert ours.dynamic_smem_bytes == experiment.RegistersVBackwardSm120.smem_bytes(OURS, D64)[0]
    assert ours.dynamic_smem_bytes < BackwardSm120.smem_bytes(BASE, D64)[0] and ours.spill_store_bytes == 0


def test_causal_warps_along_n_binds_upstream_s_class_and_not_the_coordinate_mask_s():
    pc = ProblemClass(128, 128, True)
    eight = BackwardConfig(m_block_size=64, n_block_size=64, num_stages_Q=2, num_threads=256, AtomLayoutMSdP=4,
                           AtomLayoutNdKV=2, AtomLayoutMdQ=2)
    upstream = check_backward(eight, pc, TARGET)
    assert not upstream.ok and upstream.rule == "causal_bwd_SdP_warps_along_m"
    assert check_backward(BackwardConfig(**{**eight.to_dict(), "kernel": "sm120_cmask"}), pc, TARGET).ok
    # off causal problems the class is upstream's kernel under another name: refused, so a study never draws it twice
    noncausal = check_backward(BackwardConfig(**{**eight.to_dict(), "kernel": "sm120_cmask"}), D128, TARGET)
    assert not noncausal.ok and noncausal.rule == "cmask_causal_only" and "d128-noncausal-bf16 is not causal" in noncausal.message


@pytest.mark.compile
def test_a_causal_trace_runs_the_coordinate_mask_8_warps_spill_nothing_and_upstream_s_gemm_is_restored():
    # in a process of its own: the DSL fixes its arch on import
    script = """
import os, sys
os.environ.update(FLASH_ATTENTION_ARCH="sm_120", CUTE_DSL_ARCH="sm_120a", FLASH_ATTENTION_NUM_SMS="132", CUTE_DSL_KEEP="cubin")
os.environ.pop("FA4TUNE_KERNEL_CACHE", None)
sys.path.insert(0, ROOT)
from fa4tune import fake_compile
from fa4tune.config import BackwardConfig, Problem
from fa4tune.harness.candidates import load_experiment
exp = load_experiment(ROOT + "/experiment.py")
from flash_attn.cute import ampere_helpers
gemm = ampere_helpers.gemm
config = BackwardConfig(m_block_size=64, n_block_size=64, num_stages_Q=2, num_threads=256, AtomLayoutMSdP=4,
                        AtomLayoutNdKV=2, AtomLayoutMdQ=2, kernel="sm120_cmask")  # 8 warps on a d128 causal tile
facts = fake_compile.compile_shapes(exp, "bwd", config, [Problem(1, 256, 256, 2, 2, 128, 128, True)])
print("spills", facts.spill_store_bytes, facts.registers <= 255, facts.cubin_error or "read")
config = BackwardConfig(m_block_size=64, n_block_size=64, num_threads=256, V_in_regs=True, kernel="sm120_vregs")
fake_compile.compile_shapes(exp, "bwd", config, [Problem(1, 256, 256, 2, 2, 64, 64, False)], read_facts=False)
print("gemm restored", ampere_helpers.gemm is gemm)
print("traced", exp.CoordinateMask.traces)
""".replace("ROOT", repr(str(Path(experiment.__file__).parent)))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-3:] == ["spills 0 True read", "gemm restored True", "traced 1"], done.stdout[-500:]
