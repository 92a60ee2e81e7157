"""bench/common.py: the config notations the bench command lines take, the correctness matrix, the rows; and the
layout of bench/ (scripts import the shared module plainly, the shell bundles call scripts that exist)."""

import re
import subprocess
from types import SimpleNamespace

import pytest

import experiment
from bench import common
from bench_helpers import ROOT
from fa4tune import defaults
from fa4tune.config import ForwardConfig
from fa4tune.suites import load_suite


def test_split_notation_names_its_knobs():
    plain, in_regs = common.parse_split_configs("32x96x64x2:0,32x64x64x1q:4")
    assert plain == ForwardConfig(32, 96, 64, 2, False, kernel="sm120_splitkv", extra={"num_splits": 0})
    assert in_regs == ForwardConfig(32, 64, 64, 1, True, kernel="sm120_splitkv", extra={"num_splits": 4})
    assert common.config_name(in_regs) == "sm120_splitkv 32x64 t64 s1 Q_in_regs splits=4"
    assert common.config_name(plain) == "sm120_splitkv 32x96 t64 s2 splits=auto"


def test_tma_notation_takes_a_class_flag_and_stages():
    configs = common.parse_tma_configs("64x96x128:q,128x64x128:lpt,64x64x128:q:p,64x96x128:t:s2")
    assert [c.kernel for c in configs] == ["sm120_tma", "sm120_tma_lpt", "sm120_tma_paired", "sm120_tma_trimmed"]
    assert [c.Q_in_regs for c in configs] == [True, False, True, False]
    assert [c.num_stages for c in configs] == [1, 1, 1, 2]
    for bad in ("64x96x128:cp", "64x96x128:p:t"):  # a retired class's flag, two classes
        with pytest.raises(ValueError, match="flags are"):
            common.parse_tma_configs(bad)


def test_every_tma_class_of_the_notation_is_a_kernel_class_of_the_experiment():
    from fa4tune.kernel_class import forward_kernels

    assert set(common.TMA_CLASSES.values()) | {common.SPLIT_KV} <= set(forward_kernels(experiment))


def test_one_config_in_either_notation_or_by_name():
    pc = load_suite("standard")[0].problem_class
    assert common.parse_config("32x64x64x1q:4").kernel == "sm120_splitkv"
    assert common.parse_config("64x96x128:q:lpt").kernel == "sm120_tma_lpt"
    assert common.resolve_config("dispatch", pc, experiment) == experiment.forward_config(pc)
    assert common.resolve_config("upstream", pc, experiment) == defaults.upstream_forward(pc)


def test_the_matrix_covers_its_axes_with_partial_last_blocks():
    problems = common.matrix_problems()
    for axis, values in (("seqlen_q", set(common.MATRIX_SEQLEN_Q)), ("head_dim", set(common.MATRIX_HEAD_DIMS)), ("batch", {1, 8})):
        for causal in (False, True):
            assert {getattr(p, axis) for p in problems if p.causal == causal} == values, (axis, causal)
    assert {p.problem_class.qhead_per_kvhead for p in problems} == set(common.MATRIX_GQA)
    assert all(p.seqlen_k % 16 for p in problems)
    prefills = common.prefill_problems()
    assert {p.seqlen_q for p in prefills} == {*common.PREFILL_SEQLENS, 777} and any(p.seqlen_q > p.seqlen_k for p in prefills)
    assert len({p.label for p in problems + prefills}) == len(problems + prefills)


def test_rows_show_errors_against_their_tolerance_and_the_share_of_a_bound():
    ok = SimpleNamespace(status="ok", reason="", tflops=12.5, ms_median=0.02, max_errors={"out": 0.01, "out_tolerance": 0.016, "lse": 3e-6})
    assert common.format_errors(ok.max_errors) == "out 1.0e-02/1.6e-02 lse 3.0e-06"
    assert common.result_row("p", "c", ok, 0.01) == ("p", "c", "ok", "12.50", "0.0200", "50%", "out 1.0e-02/1.6e-02 lse 3.0e-06")
    bad = SimpleNamespace(status="incorrect", reason="out 0.5 > 0.016", tflops=None, ms_median=None, max_errors={})
    assert common.result_row("p", "c", bad, None)[2:6] == ("incorrect: out 0.5 > 0.016", "", "", "")
    assert common.geomean([2.0, 8.0]) == pytest.approx(4.0)


def test_scripts_import_the_shared_module_plainly():
    for path in (ROOT / "bench").glob("*.py"):
        text = path.read_text()
        assert "spec_from_file_location" not in text, path.name
        assert not re.search(r"sys\.path\.insert\(0, str\(ROOT / \"bench\"\)\)", text), path.name


def test_the_shell_bundles_parse_and_call_scripts_that_exist():
    shells = sorted((ROOT / "bench").glob("*.sh"))
    assert shells
    for path in shells:
        assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0, path.name
    for doc in shells + [ROOT / "docs" / "gpu-runs.md"]:
        for name in re.findall(r"bench/([\w.]+\.(?:py|sh))", doc.read_text()):
            assert (ROOT / "bench" / name).exists(), (doc.name, name)
