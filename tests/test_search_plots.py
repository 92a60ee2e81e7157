"""report --plots: the four figures, their numbers, and where each figure says its numbers come from."""

from __future__ import annotations

import json
from dataclasses import replace

import matplotlib
import pytest

matplotlib.use("Agg")

from review_studies import BWD, BWD_CLASS, FWD_GQA, FWD_GQA_RUNNER_UP, FWD_MHA, FWD_MHA_RUNNER_UP, backward_table, forward_table, run_study  # noqa: E402
from search.evaluating.table import load_table  # noqa: E402
from search.reviewing import plots  # noqa: E402
from search.reviewing.evidence import load_studies, source_label  # noqa: E402
from search.storing.storage import open_storage  # noqa: E402
from search_helpers import run_cli  # noqa: E402

MHA, GQA = "d128-causal-bf16", "d128-causal-gqa4-bf16"


@pytest.fixture(scope="module")
def studies(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plots")
    url = f"sqlite:///{tmp / 'search.db'}"
    table = forward_table(tmp)
    run_study(url, "fwd", MHA, table, [FWD_MHA, FWD_MHA_RUNNER_UP], sampler_trials=4, seed=2)
    run_study(url, "fwd", GQA, table, [FWD_GQA, FWD_GQA_RUNNER_UP])
    run_study(url, "bwd", BWD_CLASS, backward_table(tmp), [BWD])
    return url, table, {(ev.direction, ev.problem_class.name): ev for ev in load_studies(open_storage(url))}


def test_report_plots_writes_four_pngs_next_to_the_text_report(studies, tmp_path):
    url, table, _ = studies
    done = run_cli("report", "--storage", url, "--plots", tmp_path / "figures", "--table", table, "--plot-class", MHA)
    assert done.returncode == 0, done.stderr
    assert "winner #" in done.stdout  # the text report is still printed
    for name in ("best_so_far.png", "speedup.png", "tile_heatmap.png", "registers_spills.png"):
        path = tmp_path / "figures" / name
        assert f"wrote {path}" in done.stdout and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_speedup_bars_are_the_confirmed_winners_over_upstream_defaults_per_problem(studies):
    _, _, found = studies
    fig = plots.speedup(list(found.values()), "label", None, needed=2)
    forward, backward = fig.axes[:2]
    expected = []
    for name in (MHA, GQA):
        ev = found[("fwd", name)]
        expected += [v / ev.default().tflops[p] for p, v in ev.winner().tflops.items()]
    assert [round(bar.get_width(), 6) for bar in forward.patches] == [round(v, 6) for v in expected]
    bwd = found[("bwd", BWD_CLASS)]
    assert [round(bar.get_width(), 6) for bar in backward.patches] == [
        round(v / bwd.default().tflops[p], 6) for p, v in bwd.winner().tflops.items()]
    assert "label" in fig._suptitle.get_text()


def test_a_study_without_two_confirmations_is_left_out_of_the_speedups(studies):
    _, _, found = studies
    fig = plots.speedup([found[("fwd", MHA)]], "label", None, needed=3)
    assert not fig.axes  # no panel has a bar: the figure is its one line of why
    assert f"left out: fwd {MHA}: no winner confirmed 3 times" in " ".join(fig._suptitle.get_text().split())
    fig = plots.speedup([found[("fwd", MHA)], found[("bwd", BWD_CLASS)]], "label", None, needed=2)
    assert [ax.get_title().split(":")[0] for ax in fig.axes] == ["forward", "backward"]


def test_panels_with_nothing_to_draw_are_left_out(studies):
    _, _, found = studies
    forward_only = plots.speedup([found[("fwd", MHA)], found[("fwd", GQA)]], "label", None, needed=2)
    assert [ax.get_title().split(":")[0] for ax in forward_only.axes] == ["forward"]  # no empty backward panel
    gqa = plots.tile_heatmap(found[("fwd", GQA)], "label", None)  # its trials all have num_threads=128
    assert [ax.get_title() for ax in gqa.axes if ax.images] == ["num_threads=128"]
    assert "no config with num_threads=256 measured" in " ".join(gqa._suptitle.get_text().split())
    # the GQA study has no random draws (the MHA one's depend on the search space's domain), and none of its configs
    # spills in the synthetic table's static facts (64x128 t128, 64x64 t128 and upstream's 128x64 t128: <= 160 registers)
    registers = plots.registers_spills(found[("fwd", GQA)], "label", None)
    assert [ax.get_xlabel() for ax in registers.axes] == ["registers per thread"]
    assert "registers (no config spills)" in registers._suptitle.get_text()


def test_every_title_fits_inside_its_figure(studies):
    # the bug: one study's best_so_far was 4.2 inches wide and its 110-character title was cut off on both sides
    _, table, found = studies
    evs = list(found.values())
    figures = [plots.best_so_far(evs[:1], "SYNTHETIC test data, not a measurement"), plots.best_so_far(evs, "label"),
               plots.speedup(evs[:1], "label", None, 2), plots.speedup(evs, "label", None, 2), plots.speedup([], "label", None, 2),
               plots.tile_heatmap(found[("fwd", GQA)], "label", None), plots.registers_spills(found[("fwd", MHA)], "label", None)]
    for fig in figures:
        fig.canvas.draw()
        inside = fig.bbox
        for text in [fig._suptitle, *(ax.title for ax in fig.axes)]:
            box = text.get_window_extent()
            assert inside.x0 <= box.x0 and box.x1 <= inside.x1 and box.y1 <= inside.y1, (text.get_text(), box, inside)


def test_one_config_is_one_config(studies):
    _, _, found = studies
    ev = found[("fwd", MHA)]
    baseline = replace(ev, history=[r for r in ev.history if r.proposer == "baseline"])
    # the configs the plot draws: measured and passing (a failed one has no TFLOPS to plot)
    configs = len({tuple(sorted(r.config.items())) for r in ev.history if r.evaluated and r.ok and r.confirmation_of is None})
    assert configs > 1
    for history, words in ((baseline, ", 1 config ("), (ev, f", {configs} configs (")):
        assert words in " ".join(plots.registers_spills(history, "label", None)._suptitle.get_text().split())


def test_heat_map_cells_hold_the_best_tflops_of_each_tile_over_the_other_knobs(studies):
    _, table_path, found = studies
    table = load_table(str(table_path))
    fig = plots.tile_heatmap(found[("fwd", MHA)], "label", table)
    by_threads = {ax.get_title(): ax.images[0].get_array() for ax in fig.axes if ax.images}
    best = max(m.geomean_tflops() for m in table.measurements("fwd", MHA)
               if m.ok and m.config["num_threads"] == 256 and m.config["tile_m"] == 128 and m.config["tile_n"] == 128)
    assert by_threads["num_threads=256"][1, 3] == pytest.approx(best)  # rows tile_m 64..256, columns tile_n 32..128
    assert "infeasible" in " ".join(t.get_text() for ax in fig.axes for t in ax.texts)  # tile_m=64 with 256 threads


def test_registers_plot_takes_static_facts_from_trials_else_from_the_cache_else_says_there_are_none(studies, tmp_path):
    url, _, found = studies
    ev = found[("fwd", MHA)]
    assert "static facts from the trials" in plots.registers_spills(ev, "label", None)._suptitle.get_text()
    bare = replace(ev, history=[replace(r, static={}) for r in ev.history])
    cache = tmp_path / "static-facts.jsonl"
    facts = {"kind": "fwd", "problem_class": MHA, "config": FWD_MHA.to_dict(), "status": "ok", "registers": 200,
             "spill_store_bytes": 0, "spill_load_bytes": 0}
    cache.write_text(json.dumps({"key": "k", "facts": facts}) + "\n")
    fig = plots.registers_spills(bare, "label", None, cache)
    assert "static facts from static-facts.jsonl" in fig._suptitle.get_text()
    (points,) = [c for c in fig.axes[0].collections if c.get_label() == "num_threads=256"]
    offsets = points.get_offsets()  # the winner
    assert [tuple(p) for p in offsets] == [(200, pytest.approx(bare.winner().value))]
    empty = plots.registers_spills(bare, "label", None, tmp_path / "missing.jsonl")
    assert "no static facts for this class" in empty._suptitle.get_text()


def test_best_so_far_ends_at_the_study_best_and_colours_each_proposer(studies):
    _, _, found = studies
    ev = found[("fwd", MHA)]
    fig = plots.best_so_far([ev], "label")
    line = fig.axes[0].lines[0]
    assert line.get_ydata()[-1] == pytest.approx(max(r.value for r in ev.search_trials if r.evaluated and r.ok))
    # explore: the loop's own turn when the random sampler keeps proposing refused or measured configs
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["baseline", "scripted", "random", "explore"]


def test_figures_name_their_source_and_never_call_emulation_sm120():
    replayed = "NVIDIA H200 (replayed from h200_sweep.json)"
    assert source_label(replayed, "replay", {"device": "NVIDIA H200", "mode": "emulated"}) == \
        "SM120 kernels emulated on NVIDIA H200 (replayed from h200_sweep.json)"
    assert source_label("NVIDIA H200", "emulated") == "SM120 kernels emulated on NVIDIA H200"
    assert source_label("NVIDIA GeForce RTX 5090", "native") == "SM120 hardware: NVIDIA GeForce RTX 5090"
    assert source_label("x (replayed from t.json)", "replay", {"synthetic": True, "mode": "synthetic"}).startswith("SYNTHETIC")
