"""The search-efficiency benchmark on a small SYNTHETIC table (the real one is search/data/h200_fwd_sweep.json)."""

from __future__ import annotations

import importlib.util

import pytest

from search.bench import Run, one_run, row
from search.table import load_table
from search_helpers import CLASS, run_cli, write_table


def test_bench_prints_median_and_spread_per_strategy_and_class(tmp_path):
    table = write_table(tmp_path)
    done = run_cli("bench", "--table", table, "--strategies", "random,tpe,turns", "--seeds", "3",
                   "--problem-class", CLASS, "--problem-class", "d64-noncausal-bf16", "--jobs", "1")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "SYNTHETIC test table, not a measurement" in done.stdout and "over 3 seeds" in done.stdout
    header = next(line for line in lines if line.startswith("| strategy"))
    assert CLASS in header and "d64-noncausal-bf16" in header
    rows = {line.split("|")[1].strip(): line for line in lines if line.startswith("| ") and not line.startswith("| strategy")}
    assert set(rows) == {"random", "tpe", "turns"}


def test_one_run_stops_when_it_reaches_99_percent_of_the_tables_best(tmp_path):
    table = load_table(str(write_table(tmp_path)))
    run = one_run(table, "random", "fwd", CLASS, seed=0, threshold=0.99)
    budget = len(table.measurements("fwd", CLASS))
    assert run.needed is not None and 1 <= run.needed <= budget
    # with the threshold at the best itself, the same seed needs at least as many
    assert one_run(table, "random", "fwd", CLASS, seed=0, threshold=1.0).needed >= run.needed


def test_the_scripted_turns_find_the_best_first_when_the_script_starts_there(tmp_path):
    table = load_table(str(write_table(tmp_path)))
    run = one_run(table, "turns", "fwd", CLASS, seed=0, threshold=0.0)
    assert run.needed == 1  # any passing config reaches 0% of the best: the first evaluation


def test_a_row_of_unreached_runs_shows_the_budget(tmp_path):
    table = load_table(str(write_table(tmp_path)))
    budget = len(table.measurements("fwd", CLASS))
    line = row(table, "tpe", [Run("tpe", CLASS, s, None, 0, 10) for s in range(3)])
    assert line.startswith(f"| tpe | >{budget} [>{budget}->{budget}] |")


@pytest.mark.skipif(importlib.util.find_spec("scipy") is None, reason="the GP sampler needs scipy")
def test_gp_runs_on_the_table(tmp_path):
    table = load_table(str(write_table(tmp_path)))
    assert one_run(table, "gp", "fwd", CLASS, seed=0, threshold=0.9).needed is not None


def test_bench_without_scipy_leaves_gp_out_with_a_note(tmp_path):
    if importlib.util.find_spec("scipy") is not None:
        pytest.skip("scipy is installed")
    done = run_cli("bench", "--table", write_table(tmp_path), "--strategies", "gp,random", "--seeds", "1", "--problem-class", CLASS, "--jobs", "1")
    assert done.returncode == 0 and "gp left out" in done.stderr and "| random |" in done.stdout
