"""The FP8 forward as a kernel class (kernels/fp8_forward_sm120.py, "sm120_fp8"; issue 45) on the CPU: its rules,
its opt-in (no bf16 / fp16 class runs it), the host path's one-line errors, and its sm_120a facts from real compiles
through the host path's own compile (registers, no spills, the shared storage equal to its formula, S on QMMA)."""

import json
from dataclasses import replace
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fa4tune import fp8
from fa4tune.config import ConfigError, ProblemClass
from fa4tune.feasibility import check_forward
from fa4tune.kernel_class import forward_kernels
from fa4tune.targets import get_target
from kernels.fp8_forward_sm120 import Fp8ForwardSm120, check_opted_in

ROOT = Path(__file__).resolve().parent.parent
TARGET = get_target("sm120")
D128 = ProblemClass(128, 128, True, 4)


def test_registered_never_searched_and_refused_for_every_bf16_or_fp16_class():
    assert forward_kernels()["sm120_fp8"] is Fp8ForwardSm120 and Fp8ForwardSm120.searched is False
    config = fp8.default_config(128)
    for pc in (D128, ProblemClass(64, 64, False, 1, "fp16")):
        verdict = check_forward(config, pc, TARGET)
        assert not verdict and verdict.rule == "fp8_opt_in" and "fa4tune.fp8.attention_fp8" in verdict.message
    assert check_opted_in(config, D128, TARGET)  # the caller that asked for FP8 meets every other rule


@pytest.mark.parametrize("change, rule", [
    ({"Q_in_regs": True}, "fp8_no_Q_in_regs"),
    ({"num_stages": 3}, "num_stages_domain"),
    ({"tile_m": 256, "tile_n": 128, "num_stages": 2, "num_threads": 256}, "smem_capacity"),
])
def test_the_opted_in_rules_name_what_fails(change, rule):
    verdict = check_opted_in(replace(fp8.default_config(128), **change), D128, TARGET)
    assert not verdict and verdict.rule == rule, verdict


def test_the_head_dim_must_be_a_multiple_of_32():
    verdict = check_opted_in(fp8.default_config(80), ProblemClass(80, 80, False), TARGET)
    assert not verdict and verdict.rule == "fp8_head_dim_multiple_of_32" and "80" in verdict.message


def test_the_host_path_refuses_bad_calls_with_one_error_before_any_compile():
    q, k, v = (torch.zeros(1, 64, 4, 128, dtype=torch.bfloat16) for _ in range(3))
    with pytest.raises(ConfigError, match="fp8_inputs_bf16.*float16"):
        fp8.attention_fp8(q.half(), k.half(), v.half())
    with pytest.raises(ConfigError, match="fp8_heads"):
        fp8.attention_fp8(q, k[:, :, :3], v[:, :, :3])
    with pytest.raises(ConfigError, match="fp8_shapes"):
        fp8.attention_fp8(q[0], k[0], v[0])
    with pytest.raises(ConfigError, match="fp8_no_Q_in_regs"):
        fp8.attention_fp8(q, k, v, config=replace(fp8.default_config(128), Q_in_regs=True))


def test_sm120a_facts_through_the_host_path_s_compile(tmp_path):
    """The d128 and d96 tiles the H100 run gated (128 x 64; causal with GQA 4 among them), and d64 at 128 x 64 with two
    stages. At tile_m 128 the d128 / d96 kernels spill as upstream's bf16 kernel does at the same tiles (255 registers;
    docs/measurements/data/2026-12-06-fp8/table.txt); at d64 they do not."""
    cases = [[128, 128, 64, 1, True, 4], [96, 128, 64, 1, False, 1], [64, 128, 64, 2, True, 1]]
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "fp8_probe.py"), str(tmp_path)], input=json.dumps(cases),
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert [r["case"] for r in report] == cases
    for r in report:
        assert r["smem_traced"] == r["smem_formula"] <= TARGET.smem_per_block, r
        assert r["registers"] <= 255, r
        assert r["mma"].get("QMMA.16832", 0) > 0 and r["mma"].get("HMMA.16816", 0) > 0, r  # S on e4m3, P V on bf16
    assert report[2]["spill_bytes"] == 0, report[2]
