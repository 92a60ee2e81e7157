"""dashboard: optuna-dashboard served for the storage, each trial's attrs and notes over HTTP and in a browser."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from html import unescape

import optuna
import pytest

from review_studies import FWD_MHA, FWD_MHA_RUNNER_UP, RATIONALE, forward_table, run_study
from search.reviewing.notes import FOOTER
from search.reviewing.screenshot import chromium_command
from search.storing.storage import open_storage
from search_helpers import ROOT, run_cli

STUDY = "fwd:d128-causal-bf16:sm120"
SEEDS = 40  # sampler seeds tried for the study (about 5 s each; seeds 0-29 had 11 such, 2026-12-03)
CHROMIUM = shutil.which("chromium")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as reply:
        return json.loads(reply.read())


def _study_with_failed_trials(tmp) -> str:
    """The study's storage URL, for the first sampler seed whose random trials include an infeasible config and one
    that fails the (synthetic) gate (a 192-row tile): which seed does depends on the search space (a new kernel value
    reorders the random draws), so the fixture looks for one instead of fixing it."""
    for seed in range(SEEDS):
        url = f"sqlite:///{tmp / f'search-{seed}.db'}"
        run_study(url, "fwd", "d128-causal-bf16", forward_table(tmp), [FWD_MHA, FWD_MHA_RUNNER_UP], sampler_trials=4, seed=seed)
        statuses = {t.user_attrs.get("status") for t in optuna.load_study(study_name=STUDY, storage=url).trials}
        if {"infeasible", "incorrect"} <= statuses:
            return url
    pytest.fail(f"no sampler seed of 0-{SEEDS - 1} draws both an infeasible config and one that fails the gate")


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory):
    """A study (baseline, two scripted configs with a rationale, random ones, confirmations) served on a free port.
    Its objective's name is taken away first, as a study made before search named it: the dashboard names it."""
    url = _study_with_failed_trials(tmp_path_factory.mktemp("dashboard"))
    study = optuna.load_study(study_name=STUDY, storage=url)
    study._storage.set_study_system_attr(study._study_id, "study:metric_names", None)  # Optuna's key for set_metric_names
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "search", "dashboard", "--storage", url, "--port", str(port)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        started = proc.stdout.readline() + proc.stdout.readline() + proc.stdout.readline()  # storage, notes, address
        assert f"{base}/dashboard" in started, started + proc.stderr.read() if proc.poll() is not None else started
        studies = _get(f"{base}/api/studies")["study_summaries"]
        study_id = next(s["study_id"] for s in studies if s["study_name"] == STUDY)
        yield base, study_id, _get(f"{base}/api/studies/{study_id}"), started
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _attrs(trial: dict) -> dict:
    return {a["key"]: a["value"] for a in trial["user_attrs"]}


def test_api_lists_the_study_and_each_trial_carries_tflops_status_static_facts_proposer_and_rationale(dashboard):
    base, study_id, detail, started = dashboard
    assert "notes: " in started and "written" in started
    trials = detail["trials"]
    scripted = [t for t in trials if _attrs(t)["proposer"] == "scripted"]
    assert len(scripted) == 2 and all(_attrs(t)["rationale"] == RATIONALE for t in scripted)
    for t in scripted:
        a = _attrs(t)
        assert a["status"] == "ok" and "b1 s8192 h16 d128 causal" in json.loads(a["tflops"])
        assert json.loads(a["measurement"])["static"]["registers"] > 0
    infeasible = [t for t in trials if _attrs(t).get("status") == "infeasible"]
    assert infeasible, "the random sampler's trials include no infeasible config"
    for t in infeasible:
        a = _attrs(t)
        assert a["rule"] and a["reason"] and json.loads(a["constraint"])[0] > 0


def test_notes_show_feasibility_and_the_study_baseline(dashboard):
    _, _, detail, _ = dashboard
    study_note = detail["note"]["body"]
    for words in ("`d128-causal-bf16`: head_dim 128", "| target | `sm120`", "| device | synthetic (not a measurement)",
                  "| mode | `replay`", "| upstream default | `tile_m=128 tile_n=64 num_threads=128 num_stages=1 Q_in_regs=False`: "):
        assert words in study_note
    baseline = next(t for t in detail["trials"] if _attrs(t)["proposer"] == "baseline")
    assert f"{float(_attrs(baseline)['geomean_tflops']):.1f} TFLOPS geomean (trial #{baseline['number']})" in study_note
    infeasible = next(t for t in detail["trials"] if _attrs(t).get("status") == "infeasible")
    note = infeasible["note"]["body"]
    assert note.startswith(f"**feasible: no** · rule `{_attrs(infeasible)['rule']}`: {_attrs(infeasible)['reason']}")
    incorrect = next((t for t in detail["trials"] if _attrs(t).get("status") == "incorrect"), None)
    assert incorrect, "the study has no trial that failed the gate (see _study_with_failed_trials)"
    assert incorrect["note"]["body"].startswith("**feasible: yes** · **incorrect**: incorrect: failed the correctness gate")
    scripted = next(t for t in detail["trials"] if _attrs(t)["proposer"] == "scripted")
    assert "**feasible: yes** · **ok**" in scripted["note"]["body"] and f"> {RATIONALE}" in scripted["note"]["body"]
    assert "static facts (sm_120a cubin):\n\n| registers | stack B |" in scripted["note"]["body"] and FOOTER in scripted["note"]["body"]


def test_the_value_axis_is_named_no_infeasible_or_failed_trial_is_at_0_and_values_are_rounded(dashboard):
    _, _, detail, started = dashboard
    # the plots' value axis: optuna-dashboard writes "Objective 0" where the study has no metric name
    assert detail["objective_names"] == ["fwd TFLOPS (geomean)"] and "objective named on 1 study" in started
    trials = detail["trials"]
    failed = [t for t in trials if _attrs(t).get("status") in ("infeasible", "incorrect")]
    assert {_attrs(t)["status"] for t in failed} == {"infeasible", "incorrect"}
    # told PRUNED without a value (their constraint says why), so the history plot does not draw them at 0
    assert all(t["state"] == "Pruned" and "values" not in t for t in failed)
    assert not [t for t in trials if t.get("values") == [0]]
    ok = [t for t in trials if _attrs(t).get("status") == "ok"]
    for t in ok:  # told rounded to 0.01 TFLOPS; the exact geomean stays in its attr
        assert t["values"] == [round(float(_attrs(t)["geomean_tflops"]), 2)]
    assert any(float(_attrs(t)["geomean_tflops"]) != t["values"][0] for t in ok), "no value needed rounding"
    (best,) = detail["best_trials"]
    assert best["values"] == [max(t["values"][0] for t in ok)] and len(repr(best["values"][0]).split(".")[1]) <= 2


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (`apt-get install chromium`; .ci/run installs it)")
def test_the_page_renders_the_study_and_a_rationale_in_headless_chromium(dashboard, tmp_path):
    base, study_id, detail, _ = dashboard
    scripted = next(t for t in detail["trials"] if _attrs(t)["proposer"] == "scripted")
    page = f"{base}/dashboard/studies/{study_id}/trials?numbers={scripted['number']}"
    def command(*action):
        return chromium_command(page, tmp_path / "profile", *action, size=(1400, 900), virtual_time_ms=15000)
    dom = subprocess.run(command("--dump-dom"), capture_output=True, text=True, timeout=180).stdout
    text = unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", re.sub(r"<style[^>]*>.*?</style>", "", dom, flags=re.S))))
    assert STUDY in text and RATIONALE in text and "feasible: yes" in text
    shot = tmp_path / "dashboard.png"
    subprocess.run(command(f"--screenshot={shot}"), capture_output=True, timeout=180)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    artifacts = Path(os.environ.get("FA4TUNE_TEST_ARTIFACTS", tempfile.gettempdir())) / "fa4tune-artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)  # a page a person can look at, outside the checkout
    shutil.copy(shot, artifacts / "dashboard.png")


# -- bad input: one line on stderr, exit code 2, nothing written ----------------------------------------


def test_a_port_in_use_is_refused_before_any_note_is_written(tmp_path):
    url = f"sqlite:///{tmp_path / 'search.db'}"
    run_study(url, "fwd", "d128-causal-bf16", forward_table(tmp_path), [FWD_MHA], confirmations=0)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_cli("dashboard", "--storage", url, "--port", port, timeout=60)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "port_in_use" in lines[0] and str(port) in lines[0]
    storage = open_storage(url)
    system = storage.get_study_system_attrs(storage.get_study_id_from_name(STUDY))
    assert not [k for k in system if k.startswith("dashboard:")]


def test_a_storage_that_does_not_exist_is_refused(tmp_path):
    done = run_cli("dashboard", "--storage", f"sqlite:///{tmp_path / 'none.db'}", "--port", _free_port(), timeout=60)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "does not exist" in lines[0]
    assert not (tmp_path / "none.db").exists()


def test_binding_beyond_loopback_warns(tmp_path):
    from search.reviewing import dashboard

    url = f"sqlite:///{tmp_path / 'search.db'}"
    run_study(url, "fwd", "d128-causal-bf16", forward_table(tmp_path), [FWD_MHA], confirmations=0)
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "search", "dashboard", "--storage", url, "--port", str(port), "--host", "0.0.0.0"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        warning = proc.stderr.readline()
        assert warning.startswith("warning: serving on 0.0.0.0") and "no login" in warning
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert dashboard.DEFAULT_HOST == "127.0.0.1"


def test_a_note_edited_by_hand_is_left_alone(tmp_path):
    from optuna_dashboard._note import get_note_from_system_attrs, save_note_with_version

    from search.reviewing.notes import write_notes

    url = f"sqlite:///{tmp_path / 'search.db'}"
    run_study(url, "fwd", "d128-causal-bf16", forward_table(tmp_path), [FWD_MHA], confirmations=0)
    storage = open_storage(url)
    study_id = storage.get_study_id_from_name(STUDY)
    written, kept = write_notes(storage)
    assert written > 1 and kept == 0
    save_note_with_version(storage, study_id, None, 2, "my own words")
    assert write_notes(storage) == (0, 1)
    assert get_note_from_system_attrs(storage.get_study_system_attrs(study_id), None)["body"] == "my own words"


def test_search_run_leaves_a_note_on_each_study(tmp_path):
    from optuna_dashboard._note import get_note_from_system_attrs

    from search_helpers import replay_args, write_table

    url = f"sqlite:///{tmp_path / 'search.db'}"
    done = run_cli(*replay_args(url, write_table(tmp_path), "--proposer", "none", "--n-trials", "3", "--confirmations", "0"))
    assert done.returncode == 0, done.stderr
    storage = open_storage(url)
    system = storage.get_study_system_attrs(storage.get_study_id_from_name(STUDY))
    note = get_note_from_system_attrs(system, None)["body"]
    assert note.startswith(f"## {STUDY}") and "| upstream default |" in note and "| mode | `replay`" in note
    assert "The table's numbers: SYNTHETIC test data" in note  # the run's table is remembered for later notes
    assert optuna.load_study(study_name=STUDY, storage=url).metric_names == ["fwd TFLOPS (geomean)"]  # named when created
    from search.reviewing.notes import write_notes

    write_notes(storage)
    assert get_note_from_system_attrs(storage.get_study_system_attrs(storage.get_study_id_from_name(STUDY)), None)["body"] == note
    assert not [k for k in system if k.startswith("dashboard:") and ":note_str:" in k and not k.startswith("dashboard:note_str:")]


def test_a_replayed_trial_note_says_replayed_never_gated_and_timed(tmp_path):
    from dataclasses import replace

    from search.reviewing.evidence import load_studies
    from search.reviewing.notes import STATUS_WORDS, trial_note

    url = f"sqlite:///{tmp_path / 'search.db'}"
    run_study(url, "fwd", "d128-causal-bf16", forward_table(tmp_path), [FWD_MHA], confirmations=0)
    (ev,) = load_studies(open_storage(url))
    ok = next(r for r in ev.history if r.ok and r.proposer == "scripted")
    note = trial_note(ev, ok)
    assert note.startswith(f"**feasible: yes** · **ok**: {ok.value:.1f} TFLOPS geomean "
                           "(replayed from synthetic_fwd.json, not measured by this run)")
    assert STATUS_WORDS["ok"] not in note and "timed" not in note
    assert STATUS_WORDS["ok"] in trial_note(ev, replace(ok, evaluator="gpu"))  # a harness measurement says so
