"""bench/stability.py's pure parts on made-up numbers: rows by (problem, direction, mode), spread across runs,
the table and the per-mode summary. Importable without a GPU."""

import pytest

from bench import stability


def rec(run, mode, problem, direction, ms, status="ok", redone=0):
    return {
        "run": run, "mode": mode, "problem": problem, "direction": direction, "status": status,
        "ms_median": ms if status == "ok" else None, "tflops": 10.0 / ms if status == "ok" else None,
        "reason": "" if status == "ok" else "boom", "timer": {"rounds_redone": redone, "block_ms_total": 1.0},
    }


RECORDS = [
    # interleaved as the script measures them: before run 1, after run 1, before run 2, ...
    rec(1, "before", "p1", "fwd", 0.060), rec(1, "before", "p1", "bwd", 0.200),
    rec(1, "after", "p1", "fwd", 0.060), rec(1, "after", "p1", "bwd", 0.200, redone=1),
    rec(2, "before", "p1", "fwd", 0.150), rec(2, "before", "p1", "bwd", 0.202),
    rec(2, "after", "p1", "fwd", 0.061), rec(2, "after", "p1", "bwd", 0.201),
    rec(3, "before", "p1", "fwd", 0.055), rec(3, "before", "p1", "bwd", 0.0, status="crash"),
    rec(3, "after", "p1", "fwd", 0.0605), rec(3, "after", "p1", "bwd", 0.204),
]


def test_spread_is_max_minus_min_over_min_in_percent():
    assert stability.spread_percent([0.06, 0.063, 0.0615]) == pytest.approx(5.0)
    assert stability.spread_percent([1.0]) == 0.0


def test_rows_group_runs_per_problem_direction_and_mode():
    table = stability.rows(RECORDS)
    assert [(r["problem"], r["direction"], r["mode"]) for r in table] == [
        ("p1", "fwd", "before"), ("p1", "bwd", "before"), ("p1", "fwd", "after"), ("p1", "bwd", "after"),
    ]
    by_key = {(r["direction"], r["mode"]): r for r in table}
    assert sorted(by_key["fwd", "before"]["runs"]) == [1, 2, 3]
    assert by_key["fwd", "before"]["spread_percent"] == pytest.approx((0.150 - 0.055) / 0.055 * 100)
    assert by_key["fwd", "after"]["spread_percent"] == pytest.approx(0.001 / 0.060 * 100)
    assert by_key["bwd", "before"]["spread_percent"] is None  # a run that crashed has no spread
    assert by_key["bwd", "after"]["rounds_redone"] == 1


def test_summary_per_mode_worst_spread_and_rows_within_3_percent():
    by_mode = stability.summary(stability.rows(RECORDS))
    assert by_mode["after"]["rows"] == 2 and by_mode["after"]["within"] == 2
    assert by_mode["after"]["worst_spread_percent"] == pytest.approx(2.0) and by_mode["after"]["worst"] == "bwd p1"
    assert by_mode["before"] == {"rows": 2, "ok": 1, "within": 0, "worst": "fwd p1",
                                 "worst_spread_percent": pytest.approx((0.150 - 0.055) / 0.055 * 100)}
    before, after = stability.summary_lines(by_mode)
    assert before.startswith("before (block=False): worst spread 172.7 % (fwd p1); 0/2 within 3 %; 1 not ok in some run")
    assert after == "after (block=True): worst spread 2.0 % (bwd p1); 2/2 within 3 %"


def test_table_shows_each_runs_median_and_tflops_and_the_spread():
    text = stability.format_table(stability.rows(RECORDS), runs=3)
    lines = text.splitlines()
    assert lines[0].split() == ["problem", "dir", "mode", "run1", "ms", "run1", "TFLOPS", "run2", "ms", "run2", "TFLOPS",
                                "run3", "ms", "run3", "TFLOPS", "spread", "%", "redone"]
    assert lines[3].split() == ["p1", "fwd", "after", "0.0600", "166.7", "0.0610", "163.9", "0.0605", "165.3", "1.7", "0"]
    assert "crash" in lines[2] and lines[2].split()[-1] == "0"  # no spread for a row with a crashed run


def test_measure_interleaves_the_modes_within_each_run_through_the_harness_measure_step(monkeypatch):
    from fa4tune import defaults
    from fa4tune.harness import steps
    from fa4tune.harness.measurement import ProblemResult
    from fa4tune.harness.settings import Settings
    from fa4tune.suites import load_suite

    calls = []

    def fake_measure_step(problem, direction, candidates, *, device, settings, timer, flusher):
        calls.append((problem.label, direction, timer.block, flusher, settings.rounds))
        return {c.name: ProblemResult(problem.label, direction, "ok", tflops=1.0, ms_median=1.0) for c in candidates}

    class Table:  # experiment.py's dispatch table, without the kernels
        forward_config = staticmethod(defaults.upstream_forward)
        backward_config = staticmethod(defaults.upstream_backward)

    monkeypatch.setattr(steps, "measure_step", fake_measure_step)
    problems = load_suite("short")[:2]
    settings = Settings(gate_seed=5, rounds=4)
    records = stability.measure(problems, ["fwd", "bwd"], 2, settings, Table, flusher="FLUSH")
    per_pass = [(p.label, d) for p in problems for d in ("fwd", "bwd")]
    assert [(r["run"], r["mode"]) for r in records] == [
        (run, mode) for run in (1, 2) for mode in ("before", "after") for _ in per_pass
    ]
    assert [c[:2] for c in calls] == per_pass * 4
    assert [c[2] for c in calls] == ([False] * 4 + [True] * 4) * 2  # before: block=False, after: block=True
    assert all(c[3] == "FLUSH" and c[4] == 4 for c in calls)
    assert records[0]["timer"]["rounds_redone"] == 0
