"""fa4tune.keep: program.md's keep decision per problem, from results.tsv rows with per-problem quartiles."""

from __future__ import annotations

import pytest

from fa4tune import keep
from fa4tune.harness.results_tsv import ResultRow, append_row


def _t(median: float, iqr_pct: float = 0.2, status: str = "ok") -> dict:
    half = median * iqr_pct / 200
    return {"class": "c", "status": status, "ms_median": median, "ms_q1": median - half, "ms_q3": median + half}


def _row(problems: dict | None, description: str = "", configs_ok: str = "2/2", status: str = "ok") -> ResultRow:
    config = {"suite": "standard"} if problems is None else {"suite": "standard", "problems": problems}
    return ResultRow("2026-12-01T00:00:00+00:00", "abc", "manual", "sm120", "H200", "emulated", 100.0, 200.0, 1.0, 1.0,
                     1.0, configs_ok, status, "0" * 64, description, config)


INCUMBENT = [_row({"bwd d64": _t(1.302), "fwd decode": _t(0.0155, 6.3)}), _row({"bwd d64": _t(1.300), "fwd decode": _t(0.0154, 3.3)})]


def test_a_change_confined_to_one_problem_is_kept_when_that_problem_beats_its_own_noise():
    # the real case (docs/measurements/2026-12-01-h200-agent-loop.md): 5 % on one problem, IQR 0.2 %, while the
    # decode's 6 % IQR made the suite's spread too wide for the geomean rule to keep it
    candidate = [_row({"bwd d64": _t(1.234), "fwd decode": _t(0.0156, 6.2)}), _row({"bwd d64": _t(1.236), "fwd decode": _t(0.0155)})]
    decision = keep.decide(INCUMBENT, candidate)
    assert decision.keep and "bwd d64" in decision.reason
    verdicts = {v.key: v.verdict for v in decision.problems}
    assert verdicts == {"bwd d64": keep.FASTER, "fwd decode": keep.SAME}


def test_slower_beyond_noise_on_any_problem_discards_whatever_else_got_faster():
    candidate = [_row({"bwd d64": _t(1.10), "fwd decode": _t(0.0180)}), _row({"bwd d64": _t(1.10), "fwd decode": _t(0.0181)})]
    decision = keep.decide(INCUMBENT, candidate)
    assert not decision.keep and "slower" in decision.reason and "fwd decode" in decision.reason


def test_the_incumbents_own_run_to_run_difference_counts_as_noise():
    incumbent = [_row({"p": _t(1.00)}), _row({"p": _t(1.04)})]  # 4 % apart, IQRs 0.2 %
    assert not keep.decide(incumbent, [_row({"p": _t(0.98)}), _row({"p": _t(0.98)})]).keep  # 2 %: inside it
    assert keep.decide(incumbent, [_row({"p": _t(0.95)}), _row({"p": _t(0.95)})]).keep  # 5 %: beyond it


def test_both_candidate_runs_must_be_faster():
    candidate = [_row({"bwd d64": _t(1.234), "fwd decode": _t(0.0155)}), _row({"bwd d64": _t(1.301), "fwd decode": _t(0.0155)})]
    assert not keep.decide(INCUMBENT, candidate).keep


def test_a_candidate_that_failed_the_gate_anywhere_is_discarded():
    failed = _row({"bwd d64": _t(1.0), "fwd decode": _t(0.0150, status="incorrect")}, configs_ok="1/2", status="incorrect")
    decision = keep.decide(INCUMBENT, [failed, failed])
    assert not decision.keep and "did not pass the gate" in decision.reason and "1/2" in decision.reason


def test_rows_without_per_problem_timings_or_a_failed_incumbent_are_refused_with_the_row_named():
    with pytest.raises(keep.KeepError, match="row 3 .*no per-problem timings"):
        keep.decide(INCUMBENT, [_row(None, "old row")], [1, 2, 3])
    bad = _row({"p": _t(1.0)}, configs_ok="0/1", status="crash")
    with pytest.raises(keep.KeepError, match="incumbent row 1 did not pass"):
        keep.decide([bad, INCUMBENT[1]], [INCUMBENT[0]])
    with pytest.raises(keep.KeepError, match="2 rows and 1 or 2 candidate rows"):
        keep.decide(INCUMBENT[:1], INCUMBENT)


def test_the_command_line_reads_results_tsv_and_says_keep_or_run_2(tmp_path, capsys):
    path = tmp_path / "results.tsv"
    for row in INCUMBENT + [_row({"bwd d64": _t(1.234), "fwd decode": _t(0.0155)}, "change (run 1)")]:
        append_row(path, row)
    assert keep.main(["1", "2", "-1", "--results", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1].startswith("run_2: yes (faster beyond its noise on 1 problem(s)")
    append_row(path, _row({"bwd d64": _t(1.30), "fwd decode": _t(0.0155)}, "change (run 2)"))
    assert keep.main(["1", "2", "3", "4", "--results", str(path)]) == 1
    assert capsys.readouterr().out.splitlines()[-1].startswith("keep: no")
    assert keep.main(["--list", "--results", str(path)]) == 0
    assert "change (run 2)" in capsys.readouterr().out
    assert keep.main(["1", "2", "9", "--results", str(path)]) == 2
    assert "row 9: results.tsv has rows 1 to 4" in capsys.readouterr().err
    assert keep.main(["1", "2", "3", "--results", str(tmp_path / "none.tsv")]) == 2


def test_a_median_drifting_between_runs_within_the_noise_floor_is_not_called_slower():
    # the real case: an unchanged problem 0.56 % slower in the next run, its IQR 0.45 %
    incumbent = [_row({"p": _t(1.3857, 0.45)}), _row({"p": _t(1.3856, 0.3)})]
    decision = keep.decide(incumbent, [_row({"p": _t(1.3934, 0.45)})])
    assert decision.problems[0].verdict == keep.SAME and decision.problems[0].noise_pct == keep.NOISE_FLOOR_PCT
    beyond = 1.3857 * (1 + 2 * keep.NOISE_FLOOR_PCT / 100)
    assert keep.decide(incumbent, [_row({"p": _t(beyond, 0.45)})]).problems[0].verdict == keep.SLOWER


def test_list_prints_the_geomeans_formatted_like_the_rest_of_its_table(tmp_path, capsys):
    # a user's report (issue 40): `--list` printed the floats as Python writes them (305.8331071710238)
    path = tmp_path / "results.tsv"
    from dataclasses import replace

    append_row(path, replace(_row({"p": _t(1.0)}, "unrounded"), fwd_tflops_geomean=305.8331071710238, bwd_tflops_geomean=None))
    assert keep.main(["--list", "--results", str(path)]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert "fwd   305.83  bwd        -" in line and "305.833" not in line and "None" not in line


def test_without_results_tsv_it_says_in_one_line_what_to_run_first(tmp_path, capsys):
    from fa4tune import keep

    assert keep.main(["--results", str(tmp_path / "results.tsv")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: no_results: ") and "run 'uv run python experiment.py > run.log' first" in line


def test_keep_and_the_results_tsv_writer_are_pinned():
    # issue 66: what decides the keep, and the rows it reads, cannot be edited under a "harness as pinned"
    from fa4tune.harness import guards

    assert {"fa4tune/keep.py", "fa4tune/harness/results_tsv.py"} <= set(guards.harness_files())
