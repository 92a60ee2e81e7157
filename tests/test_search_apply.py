"""apply: confirmed winners go into a copy of experiment.py as readable dict entries; anything else is refused."""

from __future__ import annotations

import ast
import shutil

import optuna
import pytest

from fa4tune import defaults
from fa4tune.config import BackwardConfig, ConfigError, ForwardConfig, ProblemClass
from search.reviewing import apply as apply_module
from search.storing import dispatch_table
from search.storing.history import records, winner
from search.storing.storage import open_storage
from search_helpers import CLASS, ROOT, replay_args, run_cli, write_table

STUDY = "fwd:d128-causal-bf16:sm120"


def _dispatch_entry(path, table: str, key: str) -> dict:
    """The keywords of experiment.py's TABLE[key] call, read by parsing the file."""
    return dispatch_table.entry_config(path.read_text(), "fwd" if table == "FORWARD_DISPATCH" else "bwd", key)


@pytest.fixture
def tuned_copy(tmp_path):
    """experiment.py as shipped (its CLASS entry tuned on the GPU: not upstream's default)."""
    path = tmp_path / "experiment.py"
    shutil.copy(ROOT / "experiment.py", path)
    return path


@pytest.fixture
def experiment_copy(tuned_copy):
    """experiment.py with its CLASS entry back at upstream's default: a table no study has tuned yet."""
    pc = ProblemClass.parse(CLASS)
    tuned_copy.write_text(dispatch_table.edit_dispatch(tuned_copy.read_text(), "fwd", CLASS, defaults.upstream_forward(pc)))
    return tuned_copy


def _search(tmp_path, confirmations: int) -> str:
    url = f"sqlite:///{tmp_path / 'search.db'}"
    done = run_cli(*replay_args(url, write_table(tmp_path), "--proposer", "none", "--n-trials", "8", "--confirmations", confirmations))
    assert done.returncode == 0, done.stderr
    return url


@pytest.fixture(scope="module")
def confirmed_url(tmp_path_factory) -> str:
    """A replayed study whose winner was confirmed twice."""
    return _search(tmp_path_factory.mktemp("confirmed"), confirmations=2)


@pytest.fixture(scope="module")
def unconfirmed_url(tmp_path_factory) -> str:
    """A replayed study of the same class whose winner was never confirmed."""
    return _search(tmp_path_factory.mktemp("unconfirmed"), confirmations=0)


def test_apply_refuses_an_unconfirmed_winner_and_leaves_the_file_alone(unconfirmed_url, experiment_copy):
    url = unconfirmed_url
    before = experiment_copy.read_text()
    done = run_cli("apply", "--storage", url, "--experiment", experiment_copy, "--allow-replay")
    assert done.returncode == 2  # a refusal, as export's
    (refusal,) = done.stderr.splitlines()
    assert refusal.startswith(f"error: unconfirmed_winner: {STUDY}: best trial #") and "is confirmed 0 of 2 times" in refusal
    assert experiment_copy.read_text() == before


def test_a_best_trial_that_is_the_table_s_entry_owes_no_confirmation(tmp_path, experiment_copy):
    """a study whose incumbent (the entry, enqueued after the baseline) stays best changes nothing: a note, exit 0"""
    url = _search(tmp_path, confirmations=0)
    best = winner(records(optuna.load_study(study_name=STUDY, storage=open_storage(url))))
    experiment_copy.write_text(dispatch_table.edit_dispatch(experiment_copy.read_text(), "fwd", CLASS,
                                                            ForwardConfig.from_dict(best.config)))
    before = experiment_copy.read_text()
    done = run_cli("apply", "--storage", url, "--experiment", experiment_copy, "--allow-replay")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert f"{STUDY}: best trial #{best.number} (" in done.stdout and "the entry holds, nothing to write" in done.stdout
    assert experiment_copy.read_text() == before


def test_a_study_killed_before_its_first_trial_ended_is_named_empty_not_failed(tmp_path, experiment_copy):
    """a run cut by its time limit leaves the study's trials RUNNING: nothing failed the gate, nothing finished."""
    from search.proposing.samplers import make_sampler
    from search.storing.study import open_study
    from search_helpers import spec

    url = f"sqlite:///{tmp_path / 'killed.db'}"
    study = open_study(open_storage(url), spec(), make_sampler("random", 0))
    study.ask()  # left RUNNING, as a SIGKILL leaves it
    before = experiment_copy.read_text()
    done = run_cli("apply", "--storage", url, "--experiment", experiment_copy)
    assert done.returncode == 2
    (refusal,) = done.stderr.splitlines()
    assert refusal.startswith(f"error: study_empty: {STUDY}: the study has no finished trials") and "gate" not in refusal
    assert experiment_copy.read_text() == before


def test_apply_refuses_a_replayed_winner_unless_allowed(confirmed_url, experiment_copy):
    url = confirmed_url
    before = experiment_copy.read_text()
    done = run_cli("apply", "--storage", url, "--experiment", experiment_copy)
    assert done.returncode == 2
    (refusal,) = done.stderr.splitlines()
    assert refusal.startswith("error: replayed_winner: ") and "was replayed from a table, not measured by the harness" in refusal
    assert experiment_copy.read_text() == before


def test_apply_refuses_to_replace_an_entry_its_study_never_measured(confirmed_url, tuned_copy):
    # the shipped entry was measured on the GPU; a study that never measured it cannot say its winner is faster
    entry = _dispatch_entry(tuned_copy, "FORWARD_DISPATCH", CLASS)
    assert ForwardConfig.from_dict(entry) != defaults.upstream_forward(ProblemClass.parse(CLASS))
    before = tuned_copy.read_text()
    done = run_cli("apply", "--storage", confirmed_url, "--experiment", tuned_copy, "--allow-replay")
    assert done.returncode == 2
    (refusal,) = done.stderr.splitlines()
    assert refusal.startswith(f"error: unmeasured_table_entry: {STUDY}: FORWARD_DISPATCH['{CLASS}'] holds ")
    assert "never measured it" in refusal and "search run enqueues it after the baseline" in refusal
    assert tuned_copy.read_text() == before


def test_apply_writes_a_confirmed_winner_and_prints_the_diff(confirmed_url, experiment_copy):
    url = confirmed_url
    study = optuna.load_study(study_name=STUDY, storage=open_storage(url))
    best = winner(records(study))
    before = experiment_copy.read_text()
    done = run_cli("apply", "--storage", url, "--experiment", experiment_copy, "--allow-replay")
    assert done.returncode == 0, done.stdout + done.stderr
    after = experiment_copy.read_text()
    assert ForwardConfig.from_dict(_dispatch_entry(experiment_copy, "FORWARD_DISPATCH", CLASS)) == ForwardConfig.from_dict(best.config)
    # the diff replaces the one entry (wrapped if long) and nothing else; the file still parses
    diff = [line for line in done.stdout.splitlines() if line.startswith(("+", "-")) and not line.startswith(("+++", "---"))]
    removed, added = [line[1:] for line in diff if line[0] == "-"], [line[1:] for line in diff if line[0] == "+"]
    assert len(removed) == 1 and CLASS in removed[0]
    assert "\n".join(added) == dispatch_table.render_entry(CLASS, ForwardConfig.from_dict(best.config))
    assert "confirmed at" in done.stdout and f"+++ b/{experiment_copy}" in done.stdout
    assert "TFLOPS (replayed from a table, not measured by the harness)" in done.stdout
    ast.parse(after)
    assert len(after.splitlines()) == len(before.splitlines()) + len(added) - 1
    again = run_cli("apply", "--storage", url, "--experiment", experiment_copy, "--allow-replay")
    assert again.returncode == 0 and "already holds the confirmed winners" in again.stdout


def test_a_long_backward_entry_is_wrapped_and_a_new_class_is_added():
    source = (ROOT / "experiment.py").read_text()
    config = BackwardConfig(m_block_size=128, n_block_size=64, num_stages_Q=2, num_stages_dO=2, num_threads=256,
                            SdP_swapAB=True, AtomLayoutMSdP=2, AtomLayoutNdKV=8, AtomLayoutMdQ=2, V_in_regs=True)
    edited = dispatch_table.edit_dispatch(source, "bwd", "d128-causal-bf16", config)
    assert BackwardConfig.from_dict(dispatch_table.entry_config(edited, "bwd", "d128-causal-bf16")) == config
    assert max(len(line) for line in edited.splitlines()) <= max(120, max(len(line) for line in source.splitlines()))
    added = dispatch_table.edit_dispatch(edited, "fwd", "d256-noncausal-bf16", ForwardConfig(tile_m=64, tile_n=32))
    assert ForwardConfig.from_dict(dispatch_table.entry_config(added, "fwd", "d256-noncausal-bf16")) == ForwardConfig(tile_m=64, tile_n=32)
    ast.parse(added)


def test_an_entry_that_does_not_sit_on_its_own_lines_is_refused():
    source = 'FORWARD_DISPATCH = {"d128-causal-bf16": ForwardConfig(tile_m=128)}\n'
    with pytest.raises(ConfigError, match="dispatch_format"):
        dispatch_table.edit_dispatch(source, "fwd", "d128-causal-bf16", ForwardConfig())


def test_an_entry_with_a_comment_after_it_is_replaced_with_its_comment():
    source = ('BACKWARD_DISPATCH = {\n    # kept: a comment above\n'
              '    "d64-noncausal-bf16": replace(BWD, kernel="sm120_edge"),  # 1.01x sm120: a record\n}\n')
    edited = dispatch_table.edit_dispatch(source, "bwd", "d64-noncausal-bf16", BackwardConfig(num_threads=256))
    assert "# kept: a comment above" in edited and "a record" not in edited
    assert BackwardConfig.from_dict(dispatch_table.entry_config(edited, "bwd", "d64-noncausal-bf16")) == BackwardConfig(num_threads=256)


def test_an_entry_that_already_holds_the_winner_keeps_its_own_line_breaks():
    """the shipped decode entries are one short line each (`DECODE`, a name for the regime's default); a decision that
    changes nothing leaves them as written, one that changes an entry rewrites that line alone"""
    source = (ROOT / "experiment.py").read_text()
    held = "d128-noncausal-gqa4-decode-bf16"
    entry = dispatch_table.entry_config(source, "fwd", held)
    assert dispatch_table.render_entry(held, ForwardConfig.from_dict(entry)) not in source  # not apply's own wrapping
    same = apply_module.Decision(f"fwd:{held}:sm120", "fwd", held, entry)
    assert apply_module.apply(source, [same]) == source
    changed = {**entry, "tile_n": 32}
    edited = apply_module.apply(source, [same, apply_module.Decision("fwd:d128-noncausal-gqa8-decode-bf16:sm120", "fwd",
                                                                    "d128-noncausal-gqa8-decode-bf16", changed)])
    diff = [line for line in apply_module.unified_diff(source, edited, "experiment.py").splitlines()
            if line.startswith(("+", "-")) and not line.startswith(("+++", "---"))]
    lines = source.splitlines()
    start = next(i for i, line in enumerate(lines) if '"d128-noncausal-gqa8-decode-bf16"' in line)
    assert [line[1:] for line in diff if line[0] == "-"] == lines[start:start + 1]  # the changed entry's line only
    assert dispatch_table.entry_config(edited, "fwd", "d128-noncausal-gqa8-decode-bf16") == changed


def test_a_winner_that_refuses_its_class_s_shortest_problem_is_not_applied():
    """a fixed split count measured on 16K keys is refused for a 1-key decode, which the entry would also run"""
    decode = "d96-noncausal-gqa8-decode-bf16"
    fixed = {"tile_m": 32, "tile_n": 64, "num_threads": 64, "num_stages": 2, "Q_in_regs": False, "kernel": "sm120_splitkv",
             "num_splits": 32}
    note = f"fwd:{decode}:sm120: best trial #89 (9.6 TFLOPS, ...), confirmed at 9.5, 9.6 TFLOPS"
    refused = apply_module._check_shortest_problem(apply_module.Decision(f"fwd:{decode}:sm120", "fwd", decode, fixed, note=note), "sm120")
    assert refused.config is None and refused.refusal.startswith(f"entry_refuses_short_problems: fwd:{decode}:sm120: best trial #89")
    assert f"{decode} at seqlen_q=1, seqlen_k=1: num_splits_le_kv_blocks: num_splits=32 is more than the 1 KV blocks" in refused.refusal
    heuristic = apply_module.Decision(f"fwd:{decode}:sm120", "fwd", decode, {**fixed, "num_splits": 0}, note=note)
    assert apply_module._check_shortest_problem(heuristic, "sm120") == heuristic
    backward = apply_module.Decision("bwd:d128-causal-bf16:sm120", "bwd", "d128-causal-bf16", {"m_block_size": 64})
    assert apply_module._check_shortest_problem(backward, "sm120") == backward  # no per-problem rules there


def test_apply_reads_every_storage_named_a_later_study_replacing_an_earlier_of_its_name(confirmed_url, unconfirmed_url,
                                                                                      experiment_copy):
    """Two --storage flags (two GPU calls' studies) are both read, as export reads them: applying an unconfirmed run
    of the study then the confirmed one writes the winner; the other order refuses, so neither storage was dropped."""
    unconfirmed = unconfirmed_url
    before = experiment_copy.read_text()
    refused = run_cli("apply", "--storage", confirmed_url, "--storage", unconfirmed, "--experiment", experiment_copy,
                      "--allow-replay")
    assert refused.returncode == 2 and experiment_copy.read_text() == before, refused.stdout + refused.stderr
    assert refused.stdout.count("storage: ") == 2
    done = run_cli("apply", "--storage", unconfirmed, "--storage", confirmed_url, "--experiment", experiment_copy,
                   "--allow-replay")
    assert done.returncode == 0 and experiment_copy.read_text() != before, done.stdout + done.stderr
    best = winner(records(optuna.load_study(study_name=STUDY, storage=open_storage(confirmed_url))))
    assert ForwardConfig.from_dict(_dispatch_entry(experiment_copy, "FORWARD_DISPATCH", CLASS)) == ForwardConfig.from_dict(best.config)
