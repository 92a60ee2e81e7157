"""export: confirmed winners become a format-patch of upstream's interface.py that applies to the pinned wheel's
sources, compiles for sm_120a, and makes the interface pick each exported config; anything unproven is refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

from fa4tune.config import BackwardConfig, ProblemClass
from fa4tune.defaults import upstream_forward
from fa4tune.targets import get_target
from review_studies import (BWD, BWD_CLASS, FWD_GQA, FWD_GQA_RUNNER_UP, FWD_MHA, FWD_MHA_RUNNER_UP, FailingConfirmations,
                            backward_table, forward_table, run_study)
from search.proposing.samplers import make_sampler
from search.reviewing import export as exporter
from search.reviewing.evidence import load_studies
from search.storing.storage import open_storage
from search.storing.study import StudySpec, open_study
from search_helpers import ROOT, run_cli

MHA, GQA = "d128-causal-bf16", "d128-causal-gqa4-bf16"


@pytest.fixture(scope="module")
def winners_url(tmp_path_factory) -> str:
    """Three studies with confirmed winners: forward MHA and GQA (different winners), backward."""
    tmp = tmp_path_factory.mktemp("export")
    url = f"sqlite:///{tmp / 'search.db'}"
    fwd = forward_table(tmp)
    run_study(url, "fwd", MHA, fwd, [FWD_MHA, FWD_MHA_RUNNER_UP])
    run_study(url, "fwd", GQA, fwd, [FWD_GQA, FWD_GQA_RUNNER_UP])
    run_study(url, "bwd", BWD_CLASS, backward_table(tmp), [BWD])
    return url


def _export(url: str, *extra, out: Path | None = None):
    args = ["export", "--storage", url, *extra]
    return run_cli(*args, *(["--out", out] if out else []))


def test_the_studies_hold_the_scripted_winners_with_two_confirmations(winners_url):
    found = {(ev.direction, ev.problem_class.name): ev for ev in load_studies(open_storage(winners_url))}
    for key, config in ((("fwd", MHA), FWD_MHA), (("fwd", GQA), FWD_GQA), (("bwd", BWD_CLASS), BWD)):
        w = found[key].winner()
        assert w.config == config.to_dict() and w.proposer == "scripted"
        assert len(found[key].confirmed(w.number)) == 2 and found[key].default() is not None


def test_dry_run_prints_the_patch_with_its_evidence_and_writes_nothing(winners_url, tmp_path):
    out = tmp_path / "sm120-tuned.patch"
    done = _export(winners_url, "--allow-replay", "--dry-run", out=out)
    assert done.returncode == 0, done.stderr
    assert not out.exists()
    patch = done.stdout
    assert patch.startswith("From ") and "\nSubject: [PATCH] cute: tune SM120" in patch
    assert "diff --git a/flash_attn/cute/interface.py b/flash_attn/cute/interface.py" in patch
    message = patch.split("\n---\n", 1)[0]
    prose = " ".join(message.split())
    assert "Mode: replay. Replayed from the recorded table synthetic_fwd.json, not measured by this run." in prose
    assert "Device: synthetic (not a measurement) (replayed from synthetic_bwd.json)" in prose
    # the per-problem table: upstream default and winner, as the studies recorded them
    studies = {ev.problem_class.name: ev for ev in load_studies(open_storage(winners_url)) if ev.direction == "fwd"}
    for name in (MHA, GQA):
        ev = studies[name]
        for problem, tuned in ev.winner().tflops.items():
            row = next(line for line in message.splitlines() if f"  fwd  {name} " in line and problem in line)
            base = ev.default().tflops[problem]
            assert f"{base:.1f}" in row and f"{tuned:.1f}" in row and f"{tuned / base:.2f}x" in row
    assert "Correctness gate" in message and "Every winner and each of its confirmations passed: 9 (config, problem) checks" in prose
    assert f"uv run python -m search export --storage {winners_url} --out {out}" in message


def test_the_patch_applies_with_git_to_a_pristine_copy_of_the_pinned_wheel(winners_url, tmp_path):
    patch = tmp_path / "sm120-tuned.patch"
    done = _export(winners_url, "--allow-replay", out=patch)
    assert done.returncode == 0, done.stderr
    assert "wrote" in done.stdout and patch.exists()
    checkout = _pristine_checkout(tmp_path / "flash-attention")
    check = subprocess.run(["git", "apply", "--check", str(patch)], cwd=checkout, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    applied = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "am", "-q", str(patch)],
                             cwd=checkout, capture_output=True, text=True)
    assert applied.returncode == 0, applied.stderr
    patched = (checkout / "flash_attn/cute/interface.py").read_text()
    assert "def _tile_size_fwd_sm120(" in patched and "num_stages,\n        Q_in_regs,\n        is_split_kv," in patched
    # only the SM120 tables and plumbing change: the GQA class keys on qhead_per_kvhead because its winner differs
    assert "if is_causal and qhead_per_kvhead == 1:" in patched and "if is_causal and qhead_per_kvhead == 4:" in patched


@pytest.mark.compile
def test_the_patched_package_compiles_each_exported_config_for_sm120a_and_picks_it(winners_url, tmp_path):
    patch = tmp_path / "sm120-tuned.patch"
    assert _export(winners_url, "--allow-replay", out=patch).returncode == 0
    checkout = _pristine_checkout(tmp_path / "flash-attention")
    subprocess.run(["git", "apply", str(patch)], cwd=checkout, check=True)
    jobs = [
        {"kind": "fwd", "head_dim": 128, "causal": True, "qhead_per_kvhead": 1},
        {"kind": "fwd", "head_dim": 128, "causal": True, "qhead_per_kvhead": 4},
        {"kind": "bwd", "head_dim": 128, "causal": False, "qhead_per_kvhead": 1},
        {"kind": "fwd_config", "head_dim": 64, "causal": False, "qhead_per_kvhead": 1},  # not tuned: the previous default
        {"kind": "bwd_config", "head_dim": 128, "causal": True, "qhead_per_kvhead": 1},
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(checkout), str(ROOT)]), "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": "0"}
    done = subprocess.run([sys.executable, str(ROOT / "tests/patched_interface_probe.py")], input=json.dumps(jobs),
                          capture_output=True, text=True, env=env, timeout=800)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("PROBE "))[len("PROBE "):])
    assert report["interface"].startswith(str(checkout))
    mha, gqa, bwd, untuned_fwd, untuned_bwd = report["jobs"]
    fwd_knobs = lambda c: {k: v for k, v in c.to_dict().items() if k != "kernel"}  # noqa: E731
    assert mha["kernel"] == fwd_knobs(FWD_MHA) and mha["compiled"] == ["FlashAttentionForwardSm120"]
    assert gqa["kernel"] == fwd_knobs(FWD_GQA) and gqa["compiled"] == ["FlashAttentionForwardSm120"]
    assert bwd["kernel"] == BWD.to_dict() and "FlashAttentionBackwardSm120" in bwd["compiled"]
    assert bwd["postprocess_threads"] == [BWD.num_threads]
    assert untuned_fwd["config"] == fwd_knobs(upstream_forward(ProblemClass(64, 64, False)))
    assert untuned_bwd["config"] == BackwardConfig().to_dict()  # 64x64, 1 stage for d128, 128 threads


def _pristine_checkout(path: Path) -> Path:
    """The pinned wheel's flash_attn/cute sources laid out as upstream's repository, committed in git."""
    source = Path(find_spec("flash_attn.cute").origin).parent
    shutil.copytree(source, path / "flash_attn" / "cute", ignore=shutil.ignore_patterns("__pycache__"))
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q"], cwd=path, check=True)
    subprocess.run(["git", "add", "-A"], cwd=path, check=True)
    subprocess.run([*git, "commit", "-qm", "flash-attn-4 4.0.0b36"], cwd=path, check=True)
    return path


# -- code generation -------------------------------------------------------------------------------


def test_a_gqa_class_with_the_same_winner_shares_the_entry_and_a_default_winner_adds_none(winners_url):
    studies = {(ev.direction, ev.problem_class.name): ev for ev in load_studies(open_storage(winners_url))}
    mha = exporter._accept(studies[("fwd", MHA)], 2, True)
    gqa = exporter._accept(studies[("fwd", GQA)], 2, True)
    same = exporter.Winner(gqa.study, gqa.trial, mha.config, gqa.confirmations, gqa.default)
    code = exporter.forward_function([mha, same])
    assert code.count("return FwdConfig(128, 128, True, True, num_threads=256") == 1
    assert "if is_causal and qhead_per_kvhead in (1, 4):" in code
    unchanged = exporter.Winner(mha.study, mha.trial, upstream_forward(mha.study.problem_class), mha.confirmations, mha.default)
    assert not unchanged.changed
    assert exporter.forward_function([unchanged]) == exporter.forward_function([])
    compile(exporter.forward_function([mha, gqa]), "<generated>", "exec")


# -- refusals: one line on stderr, exit code 2, nothing written ------------------------------------------


def _refused(done, out: Path, *words):
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert all(w in lines[0] for w in words), lines[0]
    assert not out.exists()


def test_a_storage_that_does_not_exist_is_refused(tmp_path):
    out = tmp_path / "p.patch"
    _refused(_export(f"sqlite:///{tmp_path / 'none.db'}", out=out), out, "does not exist")
    assert not (tmp_path / "none.db").exists()


def test_an_empty_study_is_refused(tmp_path):
    url, out = f"sqlite:///{tmp_path / 'search.db'}", tmp_path / "p.patch"
    pc = ProblemClass.parse(MHA)
    open_study(open_storage(url), StudySpec("fwd", pc, (), get_target("sm120")), make_sampler("random", 0))
    _refused(_export(url, "--allow-replay", out=out), out, "study_empty", "fwd:d128-causal-bf16:sm120")


def test_a_winner_without_two_confirmations_is_refused(tmp_path):
    url, out = f"sqlite:///{tmp_path / 'search.db'}", tmp_path / "p.patch"
    run_study(url, "fwd", MHA, forward_table(tmp_path), [FWD_MHA], confirmations=1)
    _refused(_export(url, "--allow-replay", out=out), out, "unconfirmed_winner", "confirmed 1 of 2 times")


def test_a_study_without_a_passing_trial_has_no_winner(tmp_path):
    url, out = f"sqlite:///{tmp_path / 'search.db'}", tmp_path / "p.patch"
    run_study(url, "fwd", MHA, backward_table(tmp_path), [FWD_MHA])  # a forward study on a backward-only table
    _refused(_export(url, "--allow-replay", out=out), out, "no_winner", "no trial passed the correctness gate")


def test_a_winner_whose_confirmations_fail_the_gate_is_refused(tmp_path):
    url, out = f"sqlite:///{tmp_path / 'search.db'}", tmp_path / "p.patch"
    table = forward_table(tmp_path)
    run_study(url, "fwd", MHA, table, [FWD_MHA], evaluator=FailingConfirmations(table, good=2))
    _refused(_export(url, "--allow-replay", out=out), out, "gate_failed", "incorrect")


def test_a_replayed_winner_needs_allow_replay(winners_url, tmp_path):
    out = tmp_path / "p.patch"
    _refused(_export(winners_url, out=out), out, "replayed_winner", "--allow-replay")


def test_a_study_left_out_with_problem_class_is_not_exported(winners_url):
    done = _export(winners_url, "--allow-replay", "--dry-run", "--problem-class", MHA)
    assert done.returncode == 0, done.stderr
    assert "qhead_per_kvhead == 4" not in done.stdout and "Sm120BwdConfig(\n" not in done.stdout
    assert f"fwd  {MHA} " in done.stdout and f"fwd  {GQA} " not in done.stdout


def test_an_unknown_problem_class_lists_the_classes_of_the_studies(winners_url, tmp_path):
    out = tmp_path / "p.patch"
    _refused(_export(winners_url, "--allow-replay", "--problem-class", "d999", out=out), out,
             "problem_class: no study of problem class 'd999'", f"(classes: {MHA}, {GQA}")


def test_a_replayed_export_never_says_its_winners_were_measured(winners_url):
    done = _export(winners_url, "--allow-replay", "--dry-run")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "each winner was replayed from the table (not measured by the harness) 2 times" in text and "re-measured" not in text
