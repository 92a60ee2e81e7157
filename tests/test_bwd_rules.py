"""The backward rules against what was measured: the sm_120a census (search/data/bwd_census.jsonl) and the H200
sweep's gate (the backward measurements of search/data/h200_sweep.json, SM120 kernels emulated on an H200)."""

import json
import re
from pathlib import Path

import pytest

from fa4tune.census import contradictions, read_jsonl
from fa4tune.config import BackwardConfig, ProblemClass
from fa4tune.feasibility import GATE_RULES, backward_smem_bytes, check_backward
from fa4tune.targets import get_target

ROOT = Path(__file__).resolve().parent.parent
TARGET = get_target("sm120")


def _census() -> list[dict]:
    return read_jsonl(ROOT / "search/data/bwd_census.jsonl")


def _sweep() -> list[dict]:
    table = json.loads((ROOT / "search/data/h200_sweep.json").read_text())
    return [m for m in table["measurements"] if m["kind"] == "bwd"]


def _passed(m: dict) -> bool:
    return all(r["status"] == "ok" for r in m["results"])


def test_every_config_the_rules_accept_compiled_in_the_census():
    entries = _census()
    assert len(entries) > 300
    assert contradictions(entries, TARGET) == []


def test_the_sweep_passed_exactly_the_configs_the_rules_accept():
    measured = _sweep()
    assert len(measured) > 1800
    accepted = [m for m in measured if check_backward(BackwardConfig.from_dict(m["config"]), ProblemClass.parse(m["problem_class"]), TARGET)]
    assert accepted and all(_passed(m) for m in accepted), [m["config"] for m in accepted if not _passed(m)][:3]
    for m in measured:
        if not _passed(m):
            verdict = check_backward(BackwardConfig.from_dict(m["config"]), ProblemClass.parse(m["problem_class"]), TARGET)
            assert not verdict and verdict.rule in GATE_RULES | {"smem_capacity"}, (m["config"], verdict)


def test_the_shared_memory_formula_is_the_compiled_kernels():
    checked = 0
    for m in _sweep():
        found = (m.get("static") or {}).get("dynamic_smem_bytes")
        if not found:
            match = re.search(r"asks for (\d+) B", m["results"][0].get("reason", ""))
            found = int(match.group(1)) if match else 0
        if found:
            pc = ProblemClass.parse(m["problem_class"])
            assert backward_smem_bytes(BackwardConfig.from_dict(m["config"]), pc)[0] == found, m["config"]
            checked += 1
    assert checked > 1000


def test_gate_rules_name_the_knob_and_the_evidence():
    causal = ProblemClass(128, 128, True)
    v = check_backward(BackwardConfig(AtomLayoutMSdP=2), causal, TARGET)
    assert v.rule == "causal_bwd_SdP_warps_along_m" and "AtomLayoutMSdP=2" in v.message and "4" in v.message
    assert check_backward(BackwardConfig(AtomLayoutMSdP=2), ProblemClass(128, 128, False), TARGET)
    v = check_backward(BackwardConfig(V_in_regs=True), ProblemClass(64, 64, False), TARGET)
    assert v.rule == "V_in_regs_wrong_gradients"
    v = check_backward(BackwardConfig(m_block_size=32, n_block_size=64, AtomLayoutMSdP=2, AtomLayoutMdQ=2), ProblemClass(96, 96, False), TARGET)
    assert v.rule == "m_block_32_head_dim_96"
    # the census and the sweep may measure what a gate rule rejects
    assert check_backward(BackwardConfig(V_in_regs=True), ProblemClass(64, 64, False), TARGET, skip=GATE_RULES)


def test_the_census_compile_rule_keeps_a_swapped_dq_with_4_warps_along_m_off_head_dim_96_only():
    # search/data/bwd_census.jsonl: 14 of 14 such configs failed to compile for sm_120a, 12 of 12 with AtomLayoutMdQ=2 compiled
    swapped = dict(m_block_size=64, n_block_size=64, num_stages_Q=1, num_stages_dO=1, dQ_swapAB=True, AtomLayoutMSdP=4,
                   AtomLayoutNdKV=2)
    v = check_backward(BackwardConfig(**swapped, AtomLayoutMdQ=4), ProblemClass(96, 96, False), TARGET)
    assert v.rule == "dQ_swapAB_head_dim_96_atoms" and "AtomLayoutMdQ <= 2, got 4" in v.message
    assert check_backward(BackwardConfig(**swapped, AtomLayoutMdQ=2), ProblemClass(96, 96, False), TARGET)
    assert check_backward(BackwardConfig(**swapped, AtomLayoutMdQ=4), ProblemClass(128, 128, False), TARGET)


def test_smem_rule_counts_what_upstreams_formula_leaves_out():
    # upstream's can_implement: Q 16 KB + dO 16 KB + K 16 KB + V 16 KB = 64 KB fits; the compiled struct adds
    # LSE/dPsum and the P and dS tiles, and V_in_regs saves nothing
    pc, cfg = ProblemClass(128, 128, False), BackwardConfig(num_stages_Q=2, num_stages_dO=2)
    smem, breakdown = backward_smem_bytes(cfg, pc)
    assert smem == 115712 and "P and dS" in breakdown
    v = check_backward(cfg, pc, TARGET)
    assert v.rule == "smem_capacity" and "115712" in v.message


@pytest.mark.compile
def test_census_entries_compile_as_recorded():
    """Two census entries compiled again for sm_120a: one the rules accept (compiles), one a compile rule rejects."""
    from fa4tune.static_check import StaticChecker, StaticJob

    entries = _census()
    accepted = next(e for e in entries if e["status"] == "ok" and e["sample"] == "structural"
                    and check_backward(BackwardConfig.from_dict(e["config"]), ProblemClass.parse(e["problem_class"]), TARGET))
    rejected = next(e for e in entries if e["status"] == "compile_error" and e["sample"] == "rejected")
    jobs = [StaticJob("bwd", BackwardConfig.from_dict(e["config"]), ProblemClass.parse(e["problem_class"])) for e in (accepted, rejected)]
    with StaticChecker(TARGET, ROOT / "experiment.py", workers=1, cache_path=None) as checker:
        facts = checker.check(jobs, rules=False)
    assert [f.status for f in facts] == ["ok", "compile_error"], [f.reason for f in facts]
