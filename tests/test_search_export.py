"""export: confirmed winners become a format-patch of upstream's interface.py that applies to the pinned wheel's
sources, compiles for sm_120a, and makes the interface pick each exported config; anything unproven is refused."""

from __future__ import annotations

import ast
import importlib.util
import json
import lzma
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from functools import partial
from importlib.util import find_spec
from pathlib import Path

import cutlass
import pytest

from fa4tune.config import BackwardConfig, ConfigError, ForwardConfig, ProblemClass
from fa4tune.feasibility import check_forward
from fa4tune.space import forward_candidates
from fa4tune.defaults import upstream_forward
from fa4tune.sm120_interface import PINNED_FLASH_ATTN_VERSION
from fa4tune.targets import get_target
from review_studies import (BWD, BWD_CLASS, FWD_GQA, FWD_GQA_RUNNER_UP, FWD_MHA, FWD_MHA_RUNNER_UP, FailingConfirmations,
                            backward_table, forward_table, run_study)
from search.proposing.samplers import make_sampler
from search.reviewing import carry, entry_tests, upstream_lint
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


def test_the_caveat_names_the_gpu_that_measured_and_a_class_of_ours_exports_its_best_upstream_trial(tmp_path):
    """The d192/v128 backward study ran on an H100 (docs/measurements/2026-12-06-h100-models-opaque-fp8-wide.md):
    its caveat names that GPU, not the H200 of the earlier studies; its winner runs `sm120_cmask_kregs`, which the
    patch cannot carry, so export writes the best trial of upstream's kernel and says it is unconfirmed."""
    db = tmp_path / "wide.db"
    db.write_bytes(lzma.decompress((ROOT / "docs/measurements/data/2026-12-06-h100-s3-wide-d192v128-bwd.db.xz").read_bytes()))
    patch = tmp_path / "wide.patch"
    done = _export(f"sqlite:///{db}", out=patch)
    assert done.returncode == 0, done.stderr
    message = " ".join(patch.read_text().split("\n---\n", 1)[0].split())
    assert "SM120 kernels emulated on NVIDIA H100 80GB HBM3 (SM80 mma.sync code" in message and "H200" not in message
    assert "timed on that GPU" in message
    assert "'sm120_cmask_kregs'" in message and "its best trial of upstream's kernel" in message and "UNCONFIRMED" in message


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
    # the per-problem table: the winner's speedup over upstream's default, as the studies recorded them (ratios only)
    studies = {ev.problem_class.name: ev for ev in load_studies(open_storage(winners_url)) if ev.direction == "fwd"}
    for name in (MHA, GQA):
        ev = studies[name]
        for problem, tuned in ev.winner().tflops.items():
            row = next(line for line in message.splitlines() if f"  fwd  {name} " in line and problem in line)
            base = ev.default().tflops[problem]
            assert f"{tuned / base:.2f}x" in row and f"{base:.1f}" not in row
    assert "Correctness gate" in message and "Every winner and each of its confirmations passed: 9 (config, problem) checks" in prose
    assert "Tuned on bf16 inputs only; the entries key on dtype, so fp16 calls keep the previous defaults." in prose
    assert f"uv run python -m search export --storage {winners_url} --out {out}" in message


def test_the_patch_applies_with_git_to_a_pristine_copy_of_the_pinned_wheel(winners_url, tmp_path):
    patch = tmp_path / "sm120-tuned.patch"
    done = _export(winners_url, "--allow-replay", out=patch)
    assert done.returncode == 0, done.stderr
    assert "wrote" in done.stdout and patch.exists()
    # the base the patch names is the installed file, byte for byte
    assert exporter._blob_id(exporter.pristine_interface()) == exporter.UPSTREAM_INTERFACE_BLOB
    assert "flash_fwd_sm120_tma_elected.py" not in patch.read_text()  # no winner of ours: nothing to carry
    checkout = _pristine_checkout(tmp_path / "flash-attention")
    check = subprocess.run(["git", "apply", "--check", str(patch)], cwd=checkout, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    applied = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "am", "-q", str(patch)],
                             cwd=checkout, capture_output=True, text=True)
    assert applied.returncode == 0, applied.stderr
    patched = (checkout / "flash_attn/cute/interface.py").read_text()
    assert "num_stages=config.num_stages,\n                num_threads=config.num_threads,\n                Q_in_regs=config.Q_in_regs," in patched
    config = (checkout / "flash_attn/cute/config.py").read_text()
    assert "def select_sm120_fwd_tile(inputs: FwdHeuristicInputs) -> Sm120FwdTile:" in config
    # only the SM120 tables and plumbing change: the GQA class keys on qhead_per_kvhead because its winner differs, and
    # every entry on the dtype its study was tuned on
    assert 'if inputs.causal and inputs.qhead_per_kvhead == 1 and inputs.dtype == "torch.bfloat16":' in config
    assert 'if inputs.causal and inputs.qhead_per_kvhead == 4 and inputs.dtype == "torch.bfloat16":' in config


def _load_config(path: Path):
    """A config.py (host-only) loaded on its own."""
    spec = importlib.util.spec_from_file_location("patched_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _patched_config(winners_url, tmp_path: Path):
    """The exported patch applied to the pinned wheel's sources, and its config.py loaded on its own."""
    patch = tmp_path / "sm120-tuned.patch"
    assert _export(winners_url, "--allow-replay", out=patch).returncode == 0
    checkout = _pristine_checkout(tmp_path / "flash-attention")
    subprocess.run(["git", "apply", str(patch)], cwd=checkout, check=True)
    return _load_config(checkout / "flash_attn/cute/config.py")


def _fwd_inputs(cfg, hd, causal, gqa, dtype="torch.bfloat16", **more):
    """Forward inputs of the config module `cfg` for an SM120 call of that shape and dtype."""
    return cfg.FwdHeuristicInputs(device_arch=120, num_sms=170, dtype=dtype, head_dim=hd, head_dim_v=hd, num_heads=2 * gqa,
                                  num_heads_kv=2, batch_size=1, total_q=512, total_k=512, max_seqlen_q=512,
                                  max_seqlen_k=512, causal=causal, **more)


def _bwd_inputs(cfg, hd, causal, arch=120, dtype="torch.bfloat16"):
    return cfg.BwdHeuristicInputs(device_arch=arch, head_dim=hd, head_dim_v=hd, num_heads=2, num_heads_kv=2, dtype=dtype,
                                  causal=causal)


def _knobs(config) -> dict:
    """A forward config's SM120 knobs (FwdConfig's or ours)."""
    return {k: getattr(config, k) for k in ("tile_m", "tile_n", "num_threads", "num_stages", "Q_in_regs")}


def test_the_patched_config_selects_each_exported_config_and_validates_only_its_shapes_entry(winners_url, tmp_path):
    cfg = _patched_config(winners_url, tmp_path)
    fwd, bwd = partial(_fwd_inputs, cfg), partial(_bwd_inputs, cfg)
    for inputs, winner in ((fwd(128, True, 1), FWD_MHA), (fwd(128, True, 4), FWD_GQA)):
        assert _knobs(cfg.select_fwd_config(inputs)) == _knobs(winner)
    assert _knobs(cfg.select_fwd_config(fwd(64, False, 1))) == _knobs(upstream_forward(ProblemClass(64, 64, False)))
    # the studies ran on bf16: an fp16 call of a tuned shape keeps the previous default, forward and backward
    fp16 = cfg.select_fwd_config(fwd(128, True, 1, dtype="torch.float16"))
    assert _knobs(fp16) == _knobs(upstream_forward(ProblemClass(128, 128, True))) != _knobs(FWD_MHA)
    fp16 = cfg.select_bwd_config(bwd(128, False, dtype="torch.float16"))
    assert (fp16.num_threads, fp16.num_stages_Q) == (128, 1) and BWD.num_threads != 128
    # a requested tile keeps the previous knobs; the SM120 fields are refused on other architectures
    requested = cfg.select_fwd_config(fwd(128, True, 1, requested_tile_m=64, requested_tile_n=64))
    assert (requested.tile_m, requested.num_threads, requested.num_stages) == (64, 128, 1)
    sm80 = cfg.select_fwd_config(fwd(128, True, 1)._replace(device_arch=80))
    with pytest.raises(ValueError, match="SM8 forward does not expose the SM120 options"):
        cfg.validate_fwd_config(cfg.replace(sm80, num_threads=256), fwd(128, True, 1)._replace(device_arch=80))
    # backward: the tuned shape's entry is selected and validates; another shape keeps upstream's one configuration
    tuned = cfg.select_bwd_config(bwd(128, False))
    assert (tuned.tile_m, tuned.tile_n, tuned.num_threads, tuned.AtomLayoutMSdP) == (64, 64, BWD.num_threads, 4)
    with pytest.raises(ValueError, match="SM120 backward supports one configuration per shape"):
        cfg.validate_bwd_config(tuned, bwd(128, True))
    default = cfg.select_bwd_config(bwd(128, True))
    assert (default.tile_m, default.tile_n, default.num_threads, default.num_stages_Q) == (64, 64, 128, 1)


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


@pytest.mark.compile
def test_the_patched_package_compiles_the_carried_tma_class_for_sm120a_and_picks_it(tma_url, tmp_path):
    patch = tmp_path / "sm120-tuned.patch"
    assert _export(tma_url, "--allow-replay", out=patch).returncode == 0
    checkout = _pristine_checkout(tmp_path / "flash-attention")
    subprocess.run(["git", "apply", str(patch)], cwd=checkout, check=True)
    jobs = [{"kind": "fwd", "head_dim": 64, "causal": False, "qhead_per_kvhead": 1},
            {"kind": "fwd", "head_dim": 128, "causal": True, "qhead_per_kvhead": 1}]  # not tuned here: upstream's class
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(checkout), str(ROOT)]), "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": "0"}
    done = subprocess.run([sys.executable, str(ROOT / "tests/patched_interface_probe.py")], input=json.dumps(jobs),
                          capture_output=True, text=True, env=env, timeout=800)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("PROBE "))[len("PROBE "):])
    tma, untuned = report["jobs"]
    assert tma["compiled"] == ["FlashAttentionForwardSm120TmaElected"]
    assert tma["kernel"] == {k: v for k, v in FWD_TMA.to_dict().items() if k != "kernel"}
    assert untuned["compiled"] == ["FlashAttentionForwardSm120"]


def _pristine_checkout(path: Path) -> Path:
    """The pinned wheel's flash_attn/cute sources laid out as upstream's repository, committed in git."""
    source = Path(find_spec("flash_attn.cute").origin).parent
    shutil.copytree(source, path / "flash_attn" / "cute", ignore=shutil.ignore_patterns("__pycache__"))
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q"], cwd=path, check=True)
    subprocess.run(["git", "add", "-A"], cwd=path, check=True)
    subprocess.run([*git, "commit", "-qm", f"flash-attn-4 {PINNED_FLASH_ATTN_VERSION}"], cwd=path, check=True)
    return path


# -- code generation -------------------------------------------------------------------------------


def test_a_gqa_class_with_the_same_winner_shares_the_entry_and_a_default_winner_adds_none(winners_url):
    studies = {(ev.direction, ev.problem_class.name): ev for ev in load_studies(open_storage(winners_url))}
    mha = exporter._accept(studies[("fwd", MHA)], 2, True)
    gqa = exporter._accept(studies[("fwd", GQA)], 2, True)
    same = exporter.Winner(gqa.study, gqa.trial, mha.config, gqa.confirmations, gqa.default)
    code = exporter.forward_function([mha, same])
    assert code.count("return Sm120FwdTile(128, 128, num_threads=256") == 1
    assert 'if inputs.causal and inputs.qhead_per_kvhead in (1, 4) and inputs.dtype == "torch.bfloat16":' in code
    unchanged = exporter.Winner(mha.study, mha.trial, upstream_forward(mha.study.problem_class), mha.confirmations, mha.default)
    assert not unchanged.changed
    assert exporter.forward_function([unchanged]) == exporter.forward_function([])
    compile(exporter.forward_function([mha, gqa]), "<generated>", "exec")


def test_studies_of_one_shape_in_both_dtypes_give_each_dtype_its_own_winner(winners_url, tmp_path):
    """The tables key on dtype: a shape tuned on bf16 and on fp16 has an entry per dtype, each dtype takes its own
    study's winner, and a shape tuned on one dtype keeps the previous default in the other (forward and backward)."""
    studies = {(ev.direction, ev.problem_class.name): ev for ev in load_studies(open_storage(winners_url))}
    mha, gqa, bwd = (exporter._accept(studies[key], 2, True) for key in (("fwd", MHA), ("fwd", GQA), ("bwd", BWD_CLASS)))
    # the causal d128 study as if run on fp16, won by another config than the bf16 study's
    pc = replace(mha.study.problem_class, dtype="fp16")
    mha16 = replace(mha, study=replace(mha.study, name=f"fwd:{pc.name}:sm120", problem_class=pc), config=FWD_GQA)
    winners = [mha, mha16, gqa, bwd]
    text = exporter.patch_upstream(exporter.pristine_sources(), winners)[exporter.CONFIG_PATH]
    assert 'if inputs.causal and inputs.qhead_per_kvhead == 1 and inputs.dtype == "torch.float16":' in text
    (tmp_path / "config.py").write_text(text)
    cfg = _load_config(tmp_path / "config.py")
    fwd = lambda *shape, dtype: _knobs(cfg.select_fwd_config(_fwd_inputs(cfg, *shape, dtype=dtype)))  # noqa: E731
    assert fwd(128, True, 1, dtype="torch.bfloat16") == _knobs(FWD_MHA)
    assert fwd(128, True, 1, dtype="torch.float16") == _knobs(FWD_GQA)
    assert fwd(128, True, 4, dtype="torch.float16") == _knobs(upstream_forward(ProblemClass(128, 128, True, 4)))
    assert cfg.select_bwd_config(_bwd_inputs(cfg, 128, False)).num_threads == BWD.num_threads
    assert cfg.select_bwd_config(_bwd_inputs(cfg, 128, False, dtype="torch.float16")).num_threads == 128
    message = " ".join(exporter.commit_message(winners, winners_url, ["export"]).split())
    assert ("Tuned on bf16 and fp16 inputs; the entries key on dtype, so each dtype takes the entries tuned on it, and "
            "the previous defaults elsewhere.") in message
    # the upstream test lists the untuned dtype of a tuned shape only: fp16 of GQA 4 and of the backward, not of MHA
    test = entry_tests.entries(winners).split("FWD_DEFAULTS = [")[1]
    assert '("d128-causal-gqa4-fp16", 128, True, 4, False, torch.float16, dict(tile_m=128, tile_n=64,' in test
    assert '("d128-noncausal-fp16", 128, False, 1, False, torch.float16, dict(tile_m=64, tile_n=64,' in test
    assert '"d128-causal-fp16"' not in test and '"d128-causal-bf16"' not in test


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
    assert "qhead_per_kvhead == 4" not in done.stdout and "def sm120_bwd_fields" not in done.stdout
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


def test_a_replayed_exports_pull_request_says_its_evidence_is_replayed_not_measured(winners_url, tmp_path):
    # a user's report (issue 40): the .pr.md said "measured 3 times ... by the same harness" and never said replay
    patch = tmp_path / "sm120-tuned.patch"
    done = _export(winners_url, "--allow-replay", out=patch)
    assert done.returncode == 0, done.stderr
    pr = (tmp_path / "sm120-tuned.pr.md").read_text()
    assert "> **Replayed, not measured:** the evidence below was replayed from the recorded table" in pr
    assert "by the same harness" not in pr and "measured 3 times" not in pr
    rows = [line for line in pr.splitlines() if line.startswith("| fwd |") or line.startswith("| bwd |")]
    assert rows and all("replayed 3 times from a recorded table (not measured), confirmed" in row for row in rows)
    message = patch.read_text()
    assert "same study, same harness" not in message and "measured 3 times" not in message


# -- carrying our TMA class ----------------------------------------------------------------------------

TMA_CLASS, SPLITKV_CLASS = "d64-noncausal-bf16", "d128-noncausal-bf16"
FWD_TMA = ForwardConfig(tile_m=64, tile_n=64, num_threads=128, num_stages=2, Q_in_regs=False, kernel="sm120_tma")
FWD_TMA_UPSTREAM = ForwardConfig(tile_m=64, tile_n=64, num_threads=128, num_stages=2, Q_in_regs=False)  # its runner-up
FWD_SPLITKV = ForwardConfig.from_dict({"tile_m": 64, "tile_n": 32, "num_threads": 128, "num_stages": 1, "Q_in_regs": False,
                                       "kernel": "sm120_splitkv", "num_splits": 0})


def _boosted_table(tmp: Path) -> Path:
    """The synthetic forward table, with FWD_TMA and FWD_SPLITKV made the fastest of their classes."""
    path = forward_table(tmp)
    data = json.loads(path.read_text())
    for m in data["measurements"]:
        boost = {(TMA_CLASS, FWD_TMA.key()): 1.6, (TMA_CLASS, FWD_TMA_UPSTREAM.key()): 1.4,
                 (SPLITKV_CLASS, FWD_SPLITKV.key()): 2.5}.get((m["problem_class"], ForwardConfig.from_dict(m["config"]).key()))
        for r in m["results"] if boost else []:
            r["tflops"] = r["tflops"] * boost
    path.write_text(json.dumps(data))
    return path


@pytest.fixture(scope="module")
def tma_url(tmp_path_factory) -> str:
    """Two forward studies: one won by our TMA class (its runner-up uses upstream's), one won by split-KV (a prefill
    study stored before issue 68 offered split-KV to decode and chunked classes only: its space had the class)."""
    from kernels.splitkv_forward_sm120 import SplitKvForwardSm120
    from search import space as search_space

    tmp = tmp_path_factory.mktemp("export-tma")
    url = f"sqlite:///{tmp / 'search.db'}"
    table = _boosted_table(tmp)
    run_study(url, "fwd", TMA_CLASS, table, [FWD_TMA, FWD_TMA_UPSTREAM])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SplitKvForwardSm120, "regimes", frozenset({"prefill", "decode", "chunked"}))
        patch.setattr(search_space, "_FORWARD_SPACES", {})  # the spaces built under the patch stay under it
        patch.setattr(search_space, "_FEASIBLE", {})
        run_study(url, "fwd", SPLITKV_CLASS, table, [FWD_SPLITKV, FWD_MHA_RUNNER_UP])
    return url


def test_a_tma_winner_is_carried_as_a_new_upstream_file_with_its_test_and_split_kv_falls_back(tma_url, tmp_path):
    patch = tmp_path / "sm120-tuned.patch"
    done = _export(tma_url, "--allow-replay", out=patch)
    assert done.returncode == 0, done.stderr
    text = patch.read_text()
    assert "Subject: [PATCH] cute: tune SM120 forward and backward defaults per head_dim, causal and GQA; add a TMA-fed" in text
    assert "new file mode 100644\nindex 0000000000000.." in text and "--- /dev/null\n+++ b/flash_attn/cute/flash_fwd_sm120_tma_elected.py" in text
    assert " 4 files changed" in text and " create mode 100644 tests/cute/test_flash_attn_sm120_tma_elected.py" in text
    checkout = _pristine_checkout(tmp_path / "flash-attention")
    check = subprocess.run(["git", "apply", "--check", str(patch)], cwd=checkout, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "am", "-q", str(patch)], cwd=checkout, check=True)
    new = (checkout / "flash_attn/cute/flash_fwd_sm120_tma_elected.py").read_text()
    assert new == upstream_lint.format_source(carry.TMA.upstream_path, carry.upstream_source(carry.TMA))
    assert "fa4tune" not in new and "kernels." not in new and "class FlashAttentionForwardSm120TmaElected(FlashAttentionForwardSm120):" in new
    assert (checkout / "tests/cute/test_flash_attn_sm120_tma_elected.py").read_text() == upstream_lint.format_source(
        carry.TMA.test_path, carry.upstream_test(carry.TMA))
    interface = (checkout / "flash_attn/cute/interface.py").read_text()
    assert "from flash_attn.cute.flash_fwd_sm120_tma_elected import FlashAttentionForwardSm120TmaElected\n" in interface
    config = (checkout / "flash_attn/cute/config.py").read_text()
    assert "64, 64, num_threads=128, num_stages=2, Q_in_regs=False, use_tma=True" in " ".join(config.split())
    assert "    use_tma: bool = False\n" in config  # a FwdConfig field, so in the compile key
    assert "fa_fwd = (FlashAttentionForwardSm120TmaElected if config.use_tma else FlashAttentionForwardSm120)(" in interface
    for path in ("flash_attn/cute/interface.py", "flash_attn/cute/config.py", "flash_attn/cute/flash_fwd_sm120_tma_elected.py",
                 "tests/cute/test_flash_attn_sm120_tma_elected.py"):
        compile((checkout / path).read_text(), path, "exec")
    # the upstream test runs in the patched tree: can_implement's cases pass here, the outputs need an SM120 GPU
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    upstream_test = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "can_implement",
                                    "tests/cute/test_flash_attn_sm120_tma_elected.py"], cwd=checkout, env=env, capture_output=True, text=True)
    assert upstream_test.returncode == 0 and "10 passed" in upstream_test.stdout, upstream_test.stdout[-2000:]
    # the split-KV study exports its best trial of upstream's kernel, and says so
    prose = " ".join(text.split("\n---\n", 1)[0].split())
    assert f"fwd {SPLITKV_CLASS}: the winner #" in prose and "'sm120_splitkv'" in prose and "this patch does not carry" in prose
    assert "Exported instead: its best trial of upstream's kernel" in prose
    studies = {ev.problem_class.name: ev for ev in load_studies(open_storage(tma_url))}
    fallback = exporter._accept(studies[SPLITKV_CLASS], 2, True)
    assert fallback.replaces.config == FWD_SPLITKV.to_dict() and fallback.config.kernel == "sm120"
    # only a winner is re-measured: the runner-up of upstream's kernel was measured once, and the message says so
    assert fallback.config == FWD_MHA_RUNNER_UP and fallback.confirmations == ()
    assert f"#{fallback.trial.number}, " in prose and "replayed 1 time from a recorded table (not measured), UNCONFIRMED (0 of 2 confirmations)" in prose
    # the pull request's text beside the patch: the evidence table, what changes, how to test
    pr = (tmp_path / "sm120-tuned.pr.md").read_text()
    assert pr.startswith("# cute: tune SM120") and "`flash_attn/cute/flash_fwd_sm120_tma_elected.py` (new)" in pr
    tma = exporter._accept(studies[TMA_CLASS], 2, True)
    row = next(line for line in pr.splitlines() if line.startswith(f"| fwd | {TMA_CLASS} |"))
    assert f"| {tma.trial.value / tma.default.value:.2f}x |" in row and "TFLOPS" not in row  # ratios only
    assert "`FlashAttentionForwardSm120TmaElected`" in row and "replayed 3 times from a recorded table (not measured), confirmed" in row
    assert "`pytest tests/cute/test_flash_attn_sm120_tma_elected.py`" in pr and "Caveat" not in pr  # synthetic, not emulated


def test_upstream_kernels_only_exports_the_best_upstream_trial_and_no_new_file(tma_url):
    done = _export(tma_url, "--allow-replay", "--dry-run", "--upstream-kernels-only")
    assert done.returncode == 0, done.stderr
    assert "flash_fwd_sm120_tma_elected" not in done.stdout and "use_tma" not in done.stdout
    assert "return Sm120FwdTile(64, 64, num_threads=128, num_stages=2, Q_in_regs=False)" in done.stdout
    prose = " ".join(done.stdout.split("\n---\n", 1)[0].split())
    assert "--upstream-kernels-only exports the best trial of upstream's kernel instead" in prose
    assert "--upstream-kernels-only" in done.stdout.split("Reproduce", 1)[1]


def test_the_upstream_file_keeps_our_methods_verbatim_and_drops_only_the_protocol():
    ours = Path(ROOT / carry.TMA.source).read_text()
    new = carry.upstream_source(carry.TMA)
    ours_class = next(n for n in ast.parse(ours).body if isinstance(n, ast.ClassDef))
    new_class = next(n for n in ast.parse(new).body if isinstance(n, ast.ClassDef))
    kept = {m.name: ast.get_source_segment(new, m) for m in new_class.body if isinstance(m, ast.FunctionDef)}
    edited = "".join(old for old, _, _ in carry.TMA.source_edits)
    for m in ours_class.body:
        if isinstance(m, ast.FunctionDef) and m.name not in carry.PROTOCOL_MEMBERS | set(carry.TMA.member_cut):
            text = ast.get_source_segment(ours, m)
            if any(line.strip() and line in edited for line in text.splitlines()[1:]):
                kept.pop(m.name)  # a method the carry edits (the cut variant's lines, named in TMA_SOURCE_EDITS)
                continue
            assert kept.pop(m.name) == text, m.name
    assert list(kept) == ["can_implement"]  # the only method that is not ours verbatim
    names = {t.id for m in new_class.body if isinstance(m, ast.Assign) for t in m.targets}
    assert not names & carry.PROTOCOL_MEMBERS
    imports = [n.module if isinstance(n, ast.ImportFrom) else n.names[0].name
               for n in ast.parse(new).body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert not [i for i in imports if i.split(".")[0] in carry.OURS] and "flash_attn.cute.flash_fwd_sm120" in imports


def test_a_carried_source_that_uses_more_of_ours_is_refused(tmp_path):
    source = Path(ROOT / carry.TMA.source).read_text()
    (tmp_path / "kernels").mkdir()
    source = source.replace("from kernels.tuned_forward_sm120 import TunedForwardSm120",
                            "from kernels.tuned_forward_sm120 import TunedForwardSm120, round_up")
    (tmp_path / carry.TMA.source).write_text(source.replace("return 1 + 2 * num_stages", "return round_up(1 + 2 * num_stages, 1)"))
    with pytest.raises(ConfigError, match="carry_source.*uses round_up from fa4-tune's own modules"):
        carry.upstream_source(carry.TMA, root=tmp_path)


def test_the_upstream_can_implement_agrees_with_our_rules_on_every_tma_config(tmp_path):
    path = tmp_path / "flash_fwd_sm120_tma_elected.py"
    path.write_text(carry.upstream_source(carry.TMA))
    spec = importlib.util.spec_from_file_location("carried_tma", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cls, target, checked = module.FlashAttentionForwardSm120TmaElected, get_target("sm120"), {True: 0, False: 0}
    for pc in (ProblemClass(64, 64, False), ProblemClass(96, 96, True), ProblemClass(128, 128, True),
               ProblemClass(128, 128, False, 4), ProblemClass(256, 256, False)):
        for c in [c for c in forward_candidates() if c.kernel == "sm120_tma"]:
            ours = bool(check_forward(c, pc, target))
            theirs = cls.can_implement(cutlass.BFloat16, pc.head_dim, pc.head_dim_v, c.tile_m, c.tile_n, c.num_stages,
                                       c.num_threads, pc.causal, Q_in_regs=c.Q_in_regs, qhead_per_kvhead=pc.qhead_per_kvhead)
            assert theirs == ours, (pc.name, c, check_forward(c, pc, target))
            checked[ours] += 1
    assert checked[True] > 50 and checked[False] > 50


def test_the_real_study_exports_six_tma_entries_and_the_pr_carries_the_emulation_caveat(tmp_path):
    db = tmp_path / "study.db"
    db.write_bytes(lzma.decompress((ROOT / "docs/measurements/data/2026-12-01-standard-study.db.xz").read_bytes()))
    url, patch = f"sqlite:///{db}", tmp_path / "sm120-tuned.patch"
    done = _export(url, out=patch)  # every winner confirmed (the GQA backward's confirmations ran after the first call)
    assert done.returncode == 0, done.stderr
    text = patch.read_text()
    assert "# d128-causal-gqa4-bf16: 1.17x the previous default" in text
    added = [line for line in text.splitlines() if line.startswith("+")]  # entries as ruff format wraps them
    assert sum(line.endswith("use_tma=True") or "use_tma=True)" in line for line in added) == 6 and "d128-noncausal-gqa4-decode-bf16: left out: a decode class" in text
    checkout = _pristine_checkout(tmp_path / "flash-attention")
    check = subprocess.run(["git", "apply", "--check", str(patch)], cwd=checkout, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    pr = (tmp_path / "sm120-tuned.pr.md").read_text()
    assert "SM120 kernels emulated on NVIDIA H200" in pr and "RTX 5090 / RTX PRO 6000" in pr
    assert "SM120 kernels emulated on NVIDIA H200" in " ".join(text.split("\n---\n", 1)[0].split())


def test_the_shipped_tables_export_says_which_winners_ran_at_the_h200s_occupancy(tmp_path):
    """The standard study with the studies re-run at SM120's occupancy in place of its own (what experiment.py ships
    since 2026-12-02): the one older winner is marked, the caveat says why, the patch still applies."""
    import optuna

    db = tmp_path / "shipped.db"
    db.write_bytes(lzma.decompress((ROOT / "docs/measurements/data/2026-12-01-standard-study.db.xz").read_bytes()))
    url, re_run, later = f"sqlite:///{db}", [], []
    for name in ("2026-12-02-occupancy-study", "2026-12-02-occupancy2-study"):
        occ = tmp_path / f"{name}.db"
        occ.write_bytes(lzma.decompress((ROOT / f"docs/measurements/data/{name}.db.xz").read_bytes()))
        occ_url = f"sqlite:///{occ}"
        for study in optuna.get_all_study_names(occ_url):
            if not optuna.load_study(study_name=study, storage=occ_url).get_trials(states=(optuna.trial.TrialState.COMPLETE,)):
                optuna.delete_study(study_name=study, storage=occ_url)  # the GQA backward study, cut by the call's
                continue  # time limit before its first trial ended: the standard study's stays
            re_run.append(study)
        later += ["--storage", occ_url]  # a later storage's study replaces the standard study's of the same name
    assert len(re_run) == 13
    patch = tmp_path / "sm120-tuned.patch"
    done = _export(url, *later, out=patch)
    assert done.returncode == 0, done.stderr
    pr = (tmp_path / "sm120-tuned.pr.md").read_text()
    assert exporter.OCCUPANCY_CAVEAT in pr
    rows = {line.split(" | ")[0].lstrip("| ") + ":" + line.split(" | ")[1]: line for line in pr.splitlines()
            if line.startswith("| fwd |") or line.startswith("| bwd |")}
    marked = {key for key, line in rows.items() if "at NVIDIA H200's CTAs per SM" in line}
    assert {f"{n.split(':')[0]}:{n.split(':')[1]}" for n in re_run} == set(rows) - marked
    assert marked == {"bwd:d128-causal-gqa4-bf16"}
    check = subprocess.run(["git", "apply", "--check", str(patch)], cwd=_pristine_checkout(tmp_path / "fa"), capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def test_an_fp8_study_is_left_out_with_a_note(winners_url, tmp_path):
    """Upstream has no FP8 path on SM120: an opt-in FP8 class's study is never exported (an empty one is no error
    either)."""
    db = tmp_path / "search.db"
    shutil.copy(winners_url.removeprefix("sqlite:///"), db)
    url = f"sqlite:///{db}"
    open_study(open_storage(url), StudySpec("fwd", ProblemClass.parse("d128-causal-fp8"), (), get_target("sm120")),
               make_sampler("random", 0))
    done = _export(url, "--allow-replay", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "fwd:d128-causal-fp8: left out: an opt-in FP8 class" in done.stdout + done.stderr
