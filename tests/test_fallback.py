"""The fallback rule (fa4tune.fallback): which tuned entry runs a class without one, in the call path (fa4tune.api),
in what `search run` / `search apply` read from experiment.py's text (search.storing.dispatch_table), and in the
lines experiment.py's run prints."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

import experiment
from fa4tune import fallback
from fa4tune.api import DispatchTables
from fa4tune.cli import fallback_lines
from fa4tune.config import BackwardConfig, ForwardConfig, ProblemClass
from fa4tune.defaults import upstream_backward, upstream_forward
from fa4tune.suites import load_suite, problem_classes, suite_names
from search.storing.dispatch_table import effective_entry_config

ROOT = Path(__file__).resolve().parent.parent
NAMES = ["d128-causal-bf16", "d128-causal-gqa4-bf16", "d128-causal-gqa8-fp16", "d128-causal-gqa4-chunked-bf16",
         "d128-causal-gqa4-decode-bf16", "d128-noncausal-gqa4-bf16", "d96-causal-gqa4-bf16", "d128v64-causal-gqa4-bf16"]


def _nearest(name: str, names=NAMES) -> list[str]:
    return [pc.name for pc in fallback.neighbours(ProblemClass.parse(name), names)]


def test_neighbours_share_head_dims_mask_and_regime_and_come_nearest_gqa_ratio_first():
    # GQA 5: 4 (distance 1), then 8 (3, the fp16 one), then 1 (4); never another head dim, mask or regime
    assert _nearest("d128-causal-gqa5-bf16") == ["d128-causal-gqa4-bf16", "d128-causal-gqa8-fp16", "d128-causal-bf16"]
    # GQA 6: 4 and 8 tie at distance 2: the same dtype first, then the larger ratio
    assert _nearest("d128-causal-gqa6-bf16", NAMES + ["d128-causal-gqa8-bf16"])[:3] == [
        "d128-causal-gqa8-bf16", "d128-causal-gqa4-bf16", "d128-causal-gqa8-fp16"]
    # GQA 2: 1 (distance 1) before 4 (2)
    assert _nearest("d128-causal-gqa2-bf16")[0] == "d128-causal-bf16"
    assert _nearest("d128-noncausal-gqa8-bf16") == ["d128-noncausal-gqa4-bf16"]
    assert _nearest("d128-causal-gqa8-decode-bf16") == ["d128-causal-gqa4-decode-bf16"]  # a decode takes decodes only
    assert _nearest("d64-causal-bf16") == []


def test_a_chunked_class_takes_chunked_entries_before_prefill_ones_and_the_same_dtype_before_the_other():
    names = ["d128-causal-gqa4-fp16", "d128-causal-gqa4-bf16", "d128-causal-gqa4-chunked-fp16", "d128-causal-gqa8-chunked-bf16"]
    assert _nearest("d128-causal-gqa4-bf16", names) == ["d128-causal-gqa4-fp16"]  # itself left out
    assert _nearest("d128-causal-gqa4-chunked-bf16", names) == [
        "d128-causal-gqa4-chunked-fp16", "d128-causal-gqa8-chunked-bf16", "d128-causal-gqa4-bf16", "d128-causal-gqa4-fp16"]
    # a chunked entry of another GQA ratio before the prefill entry of the same ratio: the regime counts first
    assert _nearest("d128-causal-gqa2-chunked-bf16", ["d128-causal-gqa2-bf16", "d128-causal-chunked-bf16"]) == [
        "d128-causal-chunked-bf16", "d128-causal-gqa2-bf16"]
    assert _nearest("d128-causal-gqa4-fp16", ["d128-causal-gqa4-bf16", "d128-causal-gqa5-fp16"]) == [
        "d128-causal-gqa4-bf16", "d128-causal-gqa5-fp16"]  # the GQA ratio counts before the dtype
    assert _nearest("d128-causal-gqa4-bf16", ["not a class", "d128-causal-gqa4-fp16"]) == ["d128-causal-gqa4-fp16"]


def test_resolve_takes_the_own_entry_then_the_first_feasible_neighbour_then_upstream():
    table = {"d128-causal-gqa4-bf16": "four", "d128-causal-gqa8-bf16": "eight", "d128-causal-bf16": "one"}
    pc = ProblemClass.parse("d128-causal-gqa5-bf16")
    found = fallback.resolve(pc, table, lambda config, c: True)
    assert (found.config, found.source, found.rule, found.is_fallback) == ("four", "d128-causal-gqa4-bf16", "fallback", True)
    assert found.describe() == "d128-causal-gqa5-bf16 runs d128-causal-gqa4-bf16's entry (nearest GQA ratio 4)"
    tried = []
    found = fallback.resolve(pc, table, lambda config, c: tried.append(config) or config == "one")
    assert tried == ["four", "eight", "one"] and found.source == "d128-causal-bf16"
    found = fallback.resolve(pc, table, lambda config, c: False)
    assert (found.config, found.source, found.rule) == (None, None, "upstream")
    own = fallback.resolve(ProblemClass.parse("d128-causal-gqa8-bf16"), table, lambda config, c: False)
    assert (own.config, own.rule) == ("eight", "own")  # an own entry is the table's word (search apply checks it)
    fp16 = fallback.resolve(ProblemClass.parse("d128-causal-gqa4-chunked-fp16"), table, lambda config, c: True)
    assert fp16.describe() == "d128-causal-gqa4-chunked-fp16 runs d128-causal-gqa4-bf16's entry (prefill class, bf16 for fp16)"


DECODE = experiment.DECODE


def test_the_call_path_passes_over_a_neighbour_whose_config_the_static_rules_refuse_for_the_class():
    """A fixed split count of 4 cannot run a class's 1-key decode (check_forward_entry): the GQA 5 decode skips the
    GQA 4 entry that has one, takes the GQA 1 one; a forward entry for d128 is never taken by a d96 class."""
    fixed = replace(DECODE, extra={"num_splits": 4})
    tables = DispatchTables({"d128-causal-gqa4-decode-bf16": fixed, "d128-causal-decode-bf16": DECODE}, {},
                            kernel_class=experiment.kernel_class)
    gqa5 = ProblemClass.parse("d128-causal-gqa5-decode-bf16")
    assert tables.forward_config(gqa5) is DECODE
    assert tables.resolution("fwd", gqa5).source == "d128-causal-decode-bf16"
    d96 = ProblemClass.parse("d96-causal-gqa4-decode-bf16")
    assert tables.forward_config(d96) == upstream_forward(d96)
    # a causal backward needs square blocks: the GQA 3 class passes over the 32x128 config of its nearest class (GQA 4)
    rectangular, square = experiment.BACKWARD_DISPATCH["d128-noncausal-bf16"], experiment.BACKWARD_DISPATCH["d128-causal-bf16"]
    tables = DispatchTables({}, {"d128-causal-gqa4-bf16": rectangular, "d128-causal-bf16": square})
    assert tables.backward_config(ProblemClass.parse("d128-causal-gqa3-fp16")) is square
    assert tables.backward_config(ProblemClass.parse("d128-noncausal-gqa2-fp16")) == upstream_backward(ProblemClass(128, 128, False, 2, "fp16"))


def test_the_shipped_table_serves_fp16_and_other_gqa_ratios_from_its_bf16_entries():
    for name, source in [("d128-causal-fp16", "d128-causal-bf16"), ("d128-causal-gqa3-bf16", "d128-causal-gqa4-bf16"),
                         ("d128-causal-gqa6-bf16", "d128-causal-gqa8-bf16"), ("d128-causal-gqa6-decode-bf16", "d128-causal-gqa8-decode-bf16"),
                         ("d96-causal-chunked-fp16", "d96-causal-chunked-bf16"), ("d64-noncausal-gqa2-fp16", "d64-noncausal-fp16")]:
        pc = ProblemClass.parse(name)
        assert experiment.TABLES.resolution("fwd", pc).source == source, name
        assert experiment.forward_config(pc) is experiment.FORWARD_DISPATCH[source]


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_search_reads_from_experiment_py_s_text_what_the_call_path_runs_for_every_suite_class(direction):
    """`search run` (the incumbent a study measures first) and `search apply` (the entry a winner must beat) read the
    table from experiment.py's text with the same rule: the same config for every class of every suite, in both
    directions, fp16 twins included."""
    source = (ROOT / "experiment.py").read_text()
    classes = {pc for name in suite_names() for pc in problem_classes(load_suite(name))}
    classes |= {replace(pc, dtype="fp16" if pc.dtype == "bf16" else "bf16") for pc in classes}
    assert len(classes) > 60
    config_type = ForwardConfig if direction == "fwd" else BackwardConfig
    for pc in sorted(classes, key=lambda c: c.name):
        runs = experiment.forward_config(pc) if direction == "fwd" else experiment.backward_config(pc)
        read = effective_entry_config(source, direction, pc)
        upstream = upstream_forward(pc) if direction == "fwd" else upstream_backward(pc)
        assert (config_type.from_dict(read) if read is not None else upstream) == runs, pc.name


def test_experiment_py_s_run_says_which_classes_run_a_fallback():
    assert fallback_lines(experiment, load_suite("standard")) == []  # every standard class has its entry
    lines = fallback_lines(experiment, load_suite("models"))
    assert "fallback fwd: d128-causal-gqa7-fp16 runs d128-causal-gqa8-bf16's entry (nearest GQA ratio 8, bf16 for fp16)" in lines
    assert "fallback bwd: d128-causal-gqa7-bf16 runs d128-causal-gqa4-bf16's entry (nearest GQA ratio 4)" in lines
    assert "fallback fwd: d96-causal-fp16 runs d96-causal-bf16's entry (bf16 for fp16)" in lines
    assert all(line.startswith(("fallback fwd: ", "fallback bwd: ", "wide fwd: d256-")) for line in lines)
    chunked = fallback_lines(experiment, load_suite("chunked"))
    assert "fallback bwd: d128-causal-chunked-bf16 runs d128-causal-bf16's entry (prefill class)" in chunked
