"""Head dims past 128 (issue #42 item 4): where upstream's SM120 tiles do not fit 99 KB, dispatch runs ours for wide
heads (fa4tune.defaults.wide_forward / wide_backward, fallback step 4); where nothing fits, one error names the rules
with the bytes. The wide defaults compile for sm_120a without spills (the claim in fa4tune/defaults.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import experiment
from fa4tune import defaults
from fa4tune.api import attention
from fa4tune.cli import fallback_lines
from fa4tune.config import ConfigError, ProblemClass
from fa4tune.suites import SUITES_DIR, load_suite, problem_classes
from fa4tune.targets import get_target

ROOT = Path(__file__).resolve().parent.parent


def _resolved(direction: str, name: str):
    return experiment.TABLES.resolution(direction, ProblemClass.parse(name))


def test_d256_runs_ours_because_upstreams_tiles_need_more_than_99_kb_and_says_so():
    pc = ProblemClass.parse("d256-noncausal-bf16")  # the causal GQA 2 class has an entry of its own since 2026-12-06
    fwd = _resolved("fwd", pc.name)
    assert fwd.rule == "wide" and fwd.config == defaults.wide_forward(pc) == experiment.forward_config(pc)
    assert "upstream's default refused by smem_capacity: needs 131072 B of shared memory (Q 65536 + K 32768 + V 32768)" in fwd.describe()
    bwd = _resolved("bwd", "d256-noncausal-bf16")
    assert bwd.rule == "wide" and bwd.config == defaults.wide_backward(pc)
    assert "needs 148480 B of shared memory" in bwd.describe()
    # DeepSeek's q/k 192, v 128: upstream's own tiles fit (88 KB forward), so upstream's default runs the forward;
    # the backward has an entry of its own since 2026-12-06 (upstream's spills at 128 threads: 1.5 KB on sm_120a; the
    # 30.9x measured in emulation was mostly the sm_90a compile's 30 KB of spills, a row bench/fidelity.py flags)
    assert _resolved("fwd", "d192v128-causal-bf16").rule == "upstream"
    assert _resolved("bwd", "d192v128-causal-bf16").rule == "own"
    # an entry of its own, or a neighbour's, still comes first
    assert _resolved("fwd", "d128-causal-gqa4-bf16").rule == "own"


def test_no_causal_backward_fits_d256_and_a_call_that_needs_one_fails_before_the_forward_in_one_error():
    found = _resolved("bwd", "d256-causal-gqa2-bf16")
    assert found.rule == "none" and found.config is None
    text = found.describe()
    assert "needs 148480 B of shared memory" in text  # upstream's 64x64 blocks
    assert "causal_bwd_SdP_warps_along_m" in text  # ours (32x32) would put the S/dP warps along n
    q = torch.zeros(1, 64, 4, 256, dtype=torch.bfloat16, requires_grad=True)
    k = v = torch.zeros(1, 64, 2, 256, dtype=torch.bfloat16)
    with pytest.raises(ConfigError) as refused:
        attention(q, k, v, causal=True, tables=experiment.TABLES)  # CPU tensors: the refusal comes before any kernel
    assert refused.value.rule == "no_feasible_config" and "148480 B" in str(refused.value)
    # a forward-only caller gets a config for the other direction (the harness and the static check pass it along)
    assert experiment.backward_config(ProblemClass.parse("d256-causal-gqa2-bf16")) == defaults.upstream_backward(found.problem_class)


def test_a_head_dim_no_kernel_class_runs_is_refused_with_the_rule_and_both_candidates():
    with pytest.raises(ConfigError) as refused:
        experiment.forward_config(ProblemClass.parse("d512-noncausal-bf16"))
    message = str(refused.value)
    assert refused.value.rule == "no_feasible_config"
    assert message.count("head_dim_domain: kernel 'sm120") == 2 and "got 512" in message


def test_the_wide_suite_cites_each_row_and_its_run_says_which_classes_run_ours():
    rows = json.loads((SUITES_DIR / "wide.json").read_text())["problems"]
    assert all(row["source"] for row in rows)
    assert all(row["source"].startswith(("https://huggingface.co/", "synthetic")) for row in rows)
    problems = load_suite("wide")
    assert {(p.head_dim, p.head_dim_v) for p in problems} == {(256, 256), (192, 128)}
    assert not any(p.backward and p.causal and p.head_dim == 256 for p in problems)  # refused, as above
    lines = fallback_lines(experiment, problems)
    wide = {pc.name for pc in problem_classes(problems) if pc.head_dim == 256 and
            experiment.TABLES.resolution("fwd", pc).rule == "wide"}  # d256 classes with no entry of their own or a neighbour's
    assert wide and {line.split(": ")[1].split(" runs")[0] for line in lines if line.startswith("wide fwd: ")} == wide
    assert "fallback fwd: d256-causal-gqa2-fp16 runs d256-causal-gqa2-bf16's entry (bf16 for fp16)" in lines
    assert "wide bwd: d256-noncausal-bf16 runs ours for wide heads" in "\n".join(lines)


def test_the_wide_defaults_compile_for_sm120a_without_spills():
    from fa4tune.static_check import StaticJob, run_static

    causal, noncausal = ProblemClass.parse("d256-causal-gqa2-bf16"), ProblemClass.parse("d256-noncausal-bf16")
    jobs = [StaticJob("fwd", defaults.wide_forward(causal), causal), StaticJob("bwd", defaults.wide_backward(noncausal), noncausal)]
    facts = run_static(jobs, get_target("sm120"), ROOT / "experiment.py", workers=1, cache_path=None)
    for job, f in zip(jobs, facts):
        assert f.ok, (job.label(), f.reason)
        assert f.spill_store_bytes == f.spill_load_bytes == 0, job.label()
        assert f.registers <= 255 and f.blocks_per_sm == 1
