"""The search-efficiency benchmark on a small SYNTHETIC table (the real one is search/data/h200_sweep.json)."""

from __future__ import annotations

import json

from fa4tune.config import ForwardConfig
from search.evaluating.table import load_table
from search.running.bench import Run, one_run, row
from search_helpers import CLASS, run_cli, write_table


def test_bench_prints_median_and_spread_per_strategy_and_class(tmp_path):
    table = write_table(tmp_path, kernels=("sm120", "sm120_tma"))  # two classes: the cost of the bench before split-KV
    done = run_cli("bench", "--table", table, "--strategies", "random,tpe,turns,default", "--seeds", "3",
                   "--problem-class", CLASS, "--problem-class", "d64-noncausal-bf16", "--jobs", "1", timeout=400)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "SYNTHETIC test table, not a measurement" in done.stdout and "over 3 seeds" in done.stdout
    header = next(line for line in lines if line.startswith("| strategy"))
    assert CLASS in header and "d64-noncausal-bf16" in header
    rows = {line.split("|")[1].strip(): line for line in lines if line.startswith("| ") and not line.startswith("| strategy")}
    assert set(rows) == {"random", "tpe", "turns (tpe)", "default (tpe)"}


def test_bench_prints_a_progress_line_per_finished_run_before_the_strategys_row(tmp_path):
    import io
    from contextlib import redirect_stderr, redirect_stdout

    from search.__main__ import main

    table = write_table(tmp_path)
    for jobs in ("1", "2"):
        # stderr and stdout into one stream, as a terminal shows them: each run's line comes as it finishes, the row
        # after (in this process: the imports are paid once)
        merged = io.StringIO()
        with redirect_stdout(merged), redirect_stderr(merged):
            code = main(["bench", "--table", str(table), "--strategies", "random,tpe", "--seeds", "2", "--problem-class", CLASS, "--jobs", jobs])
        assert code in (0, None), merged.getvalue()
        lines = merged.getvalue().splitlines()
        for strategy in ("random", "tpe"):
            shown = [i for i, line in enumerate(lines) if line.startswith("[bench ") and f"] {strategy} {CLASS} seed " in line]
            assert len(shown) == 2, done.stdout
            assert lines[shown[0]].startswith("[bench 1/2, ") and " s] " in lines[shown[0]] and lines[shown[1]].startswith("[bench 2/2, ")
            (table_row,) = [i for i, line in enumerate(lines) if line.startswith(f"| {strategy} |")]
            assert max(shown) < table_row
        assert lines.index(next(line for line in lines if line.startswith("| strategy"))) < min(
            i for i, line in enumerate(lines) if line.startswith("[bench "))


def test_one_run_stops_when_it_reaches_99_percent_of_the_tables_best(tmp_path):
    table = load_table(str(write_table(tmp_path)))
    run = one_run(table, "random", "fwd", CLASS, seed=0, threshold=0.99)
    budget = len(table.measurements("fwd", CLASS))
    assert run.needed is not None and 1 <= run.needed <= budget
    # with the threshold at the best itself, the same seed needs at least as many
    assert one_run(table, "random", "fwd", CLASS, seed=0, threshold=1.0).needed >= run.needed


def test_default_measures_upstreams_default_first(tmp_path):
    table = load_table(str(write_table(tmp_path)))
    default = table.lookup("fwd", CLASS, ForwardConfig()).geomean_tflops()
    threshold = default / table.best("fwd", CLASS)
    assert one_run(table, "default", "fwd", CLASS, seed=0, threshold=threshold).needed == 1
    # the sampler alone does not start there: some seed needs more than one config to reach the default's speed
    # (which seeds do depends on the space: 5 and 7 of 0-11 since the cluster class left it; 20 seeds take ~4 s)
    assert any(one_run(table, "tpe", "fwd", CLASS, seed=s, threshold=threshold).needed > 1 for s in range(20))


def test_the_space_is_the_tables_and_its_gaps_are_not_evaluations(tmp_path):
    path = write_table(tmp_path, drop=20, kernels=("sm120",))  # one kernel class of three, with gaps
    data = json.loads(path.read_text())
    data["measurements"] = [m for m in data["measurements"] if m["config"]["kernel"] == "sm120"]  # the backward's too
    path.write_text(json.dumps(data))
    table = load_table(str(path))
    assert table.space("fwd").domain["kernel"] == ("sm120",)
    runs = [one_run(table, "random", "fwd", CLASS, seed=s, threshold=1.0) for s in range(3)]
    assert any(r.missing for r in runs)  # configs dropped from the table were looked up...
    assert all(r.needed <= len(table.measurements("fwd", CLASS)) for r in runs)  # ...and not counted


def test_a_row_of_unreached_runs_shows_the_budget(tmp_path):
    table = load_table(str(write_table(tmp_path)))
    budget = len(table.measurements("fwd", CLASS))
    line = row(table, "tpe", [Run("tpe", CLASS, s, None, 0, 10) for s in range(3)])
    assert line.startswith(f"| tpe | >{budget} [>{budget}->{budget}] |")


def test_gp_runs_on_the_table(tmp_path):
    table = load_table(str(write_table(tmp_path)))
    assert one_run(table, "gp", "fwd", CLASS, seed=0, threshold=0.9).needed is not None


UNSEARCHED_CLASS = """

from kernels.tma_forward_sm120 import TmaForwardSm120 as _Tma


class KeptForwardSm120(_Tma):
    name = "sm120_kept"
    knobs = {"depth": (1, 2, 3, 4, 5, 6)}
    searched = False

    def __init__(self, *args, depth: int = 1, **kwargs):
        super().__init__(*args, **kwargs)
"""


def test_the_reachable_best_leaves_out_configs_the_search_cannot_draw(tmp_path, monkeypatch):
    """A table may hold configs of a kernel class the search does not draw (`searched = False`: the bench scripts
    time them); a search can never reach them, so 99 % of the best counts only the configs in its domain."""
    import sys
    from pathlib import Path

    from fa4tune.config import ProblemClass
    from fa4tune.harness import candidates
    from fa4tune.targets import get_target
    from search.running.bench import reachable_best

    agent = tmp_path / "experiment.py"  # an experiment.py with a class the search does not draw
    agent.write_text((Path(__file__).resolve().parent.parent / "experiment.py").read_text() + UNSEARCHED_CLASS)
    monkeypatch.delitem(sys.modules, "experiment", raising=False)  # put back after the test
    candidates.load_experiment(agent)
    table = load_table(str(write_table(tmp_path)))
    space = table.space("fwd")
    pc, target = ProblemClass.parse(CLASS), get_target("sm120")
    ms = table.measurements("fwd", CLASS)
    others = [m for m in ms if space.in_domain(space.config(m.config))]
    assert others and {m.config["kernel"] for m in others} == {"sm120_kept"}
    best_other = max(m.geomean_tflops() for m in others if m.ok)
    assert best_other == table.best("fwd", CLASS)  # in this synthetic table an unsearched class holds the best
    reachable = reachable_best(table, space, "fwd", pc, target)
    assert reachable < best_other
    assert reachable in {m.geomean_tflops() for m in ms if m not in others}
