"""Recorded tables (JSON and CSV) and the replay evaluator."""

from __future__ import annotations

import csv

import pytest

from fa4tune.config import ConfigError, ForwardConfig
from search.evaluating.replay import MISSING, ReplayEvaluator
from search.evaluating.table import load_table
from search_helpers import CLASS, spec, write_table


def test_replay_answers_a_recorded_config_and_says_missing_for_the_rest(tmp_path):
    table = load_table(str(write_table(tmp_path, drop=1)))
    evaluator = ReplayEvaluator(table)
    s = spec()
    recorded = table.measurements("fwd", CLASS)[0]
    m = evaluator.evaluate("fwd", ForwardConfig.from_dict(recorded.config), s.problem_class, list(s.problems))
    assert m.ok and m.mode == "replay" and m.evaluator == "replay" and [r.tflops for r in m.results] == [r.tflops for r in recorded.results]
    missing = ForwardConfig(tile_m=64, tile_n=32, num_threads=128, num_stages=1, Q_in_regs=False, kernel="sm120")
    table.entries.pop(("fwd", CLASS, missing.key()), None)
    m = evaluator.evaluate("fwd", missing, s.problem_class, list(s.problems))
    assert m.status == MISSING and "missing from table" in m.reason and not m.ok


def test_a_problem_the_table_lacks_is_missing_too(tmp_path):
    table = load_table(str(write_table(tmp_path)))
    s = spec()
    other = spec(name="d128-noncausal-bf16").problems[0]
    m = ReplayEvaluator(table).evaluate("fwd", ForwardConfig(), s.problem_class, [s.problems[0], other])
    assert [r.status for r in m.results] == ["ok", MISSING]


def test_a_csv_table_loads_like_the_json_one(tmp_path):
    table = load_table(str(write_table(tmp_path, kernels=("sm120", "sm120_tma"))))  # classes without knobs of their own
    path = tmp_path / "table.csv"
    knobs = list(ForwardConfig().to_dict())
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, ["kind", "problem_class", *knobs, "problem", "status", "tflops", "reason"])
        writer.writeheader()
        for m in table.measurements("fwd", CLASS):
            for r in m.results:
                writer.writerow({"kind": "fwd", "problem_class": CLASS, **m.config, "problem": r.problem, "status": r.status,
                                 "tflops": r.tflops if r.tflops is not None else "", "reason": r.reason})
    from_csv = load_table(str(path))
    assert from_csv.best("fwd", CLASS) == pytest.approx(table.best("fwd", CLASS))
    assert len(from_csv.measurements("fwd", CLASS)) == len(table.measurements("fwd", CLASS))


def test_a_malformed_table_is_a_one_line_error(tmp_path):
    path = tmp_path / "table.json"
    path.write_text('{"measurements": [{"kind": "fwd"}]}')
    with pytest.raises(ConfigError, match="malformed table"):
        load_table(str(path))
