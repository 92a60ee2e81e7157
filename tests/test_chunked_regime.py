"""The chunked-prefill regime: which problems it takes, its class names, the fallback to the prefill class's entry
in dispatch, in the incumbent a study measures first, and in apply's check of what the table runs."""

from __future__ import annotations

import pytest

from fa4tune.config import CHUNKED_MIN_KV_PER_Q, ConfigError, ForwardConfig, Problem, ProblemClass, regime_of
from search.reviewing.apply import Decision, _check_incumbent
from search.storing.dispatch_table import effective_entry_config
from search.storing.history import TrialRecord

PREFILL = ProblemClass(128, 128, True)
CHUNKED = ProblemClass(128, 128, True, regime="chunked")
ENTRY = ForwardConfig(tile_m=64, tile_n=64, num_threads=128, num_stages=1, kernel="sm120_tma")
SOURCE = f'''
FORWARD_DISPATCH = {{
    "{PREFILL.name}": ForwardConfig(tile_m=64, tile_n=64, num_threads=128, num_stages=1, Q_in_regs=False, kernel="sm120_tma"),
}}
BACKWARD_DISPATCH = {{
}}
'''


@pytest.mark.parametrize("seqlen_q, seqlen_k, causal, regime", [
    (1, 4096, False, "decode"), (16, 4096, True, "decode"),  # a decode first, causal or not
    (1024, 1024 * CHUNKED_MIN_KV_PER_Q, True, "chunked"), (512, 8192, True, "chunked"),
    (1024, 1024 * CHUNKED_MIN_KV_PER_Q - 1, True, "prefill"),  # just under 2 keys per query token
    (1024, 8192, False, "prefill"),  # non-causal: no mask to speak of
    (4096, 4096, True, "prefill"),
])
def test_regime_of_a_problem(seqlen_q, seqlen_k, causal, regime):
    assert regime_of(seqlen_q, seqlen_k, causal) == regime
    assert Problem(2, seqlen_q, seqlen_k, 16, 16, 128, 128, causal).problem_class.regime == regime


def test_a_chunked_class_has_a_name_of_its_own_that_parses_back():
    gqa = ProblemClass(128, 128, True, 4, "fp16", "chunked")
    assert CHUNKED.name == "d128-causal-chunked-bf16" and gqa.name == "d128-causal-gqa4-chunked-fp16"
    assert ProblemClass.parse(CHUNKED.name) == CHUNKED and ProblemClass.parse(gqa.name) == gqa


def test_a_non_causal_chunked_class_names_the_rule():
    with pytest.raises(ConfigError, match="^regime: a chunked prefill is causal"):
        ProblemClass(128, 128, False, regime="chunked")
    with pytest.raises(ConfigError, match="^regime: "):
        ProblemClass.parse("d128-noncausal-chunked-bf16")


def test_the_effective_entry_is_the_class_own_then_its_prefill_class_then_none():
    assert ForwardConfig.from_dict(effective_entry_config(SOURCE, "fwd", CHUNKED)) == ENTRY
    own = f'''
FORWARD_DISPATCH = {{
    "{PREFILL.name}": ForwardConfig(tile_m=64, tile_n=64, num_threads=128, num_stages=1, kernel="sm120_tma"),
    "{CHUNKED.name}": ForwardConfig(tile_m=128, tile_n=64, num_threads=128, num_stages=1),
}}
BACKWARD_DISPATCH = {{
}}
'''
    assert effective_entry_config(own, "fwd", CHUNKED)["tile_m"] == 128
    assert effective_entry_config(SOURCE, "bwd", CHUNKED) is None  # upstream's default runs
    assert effective_entry_config(SOURCE, "fwd", ProblemClass(128, 128, False, regime="decode")) is None


def _measured(config: ForwardConfig) -> TrialRecord:
    return TrialRecord(0, "COMPLETE", "tpe", config.to_dict(), "ok", 300.0, evaluated=True)


def test_apply_refuses_a_chunked_winner_whose_study_never_measured_the_prefill_entry_dispatch_runs():
    winner = ForwardConfig(tile_m=128, tile_n=128, num_threads=128, num_stages=1).to_dict()
    decision = Decision(f"fwd:{CHUNKED.name}:sm120", "fwd", CHUNKED.name, winner, note="best trial #3 (300.0 TFLOPS)")
    refused = _check_incumbent(decision, SOURCE, [_measured(ForwardConfig(**winner))])
    assert refused.config is None and refused.refusal.startswith(f"unmeasured_table_entry: fwd:{CHUNKED.name}:sm120: ")
    accepted = _check_incumbent(decision, SOURCE, [_measured(ForwardConfig(**winner)), _measured(ENTRY)])
    assert accepted == decision


def test_a_knob_written_through_a_module_level_name_reads_as_its_literal():
    # search reads experiment.py's text: `kernel=KREGS` read as no entry made the class fall back in the search's
    # view while dispatch ran the entry (tests/test_fallback.py caught it on 2026-12-06)
    source = '''
from dataclasses import replace
KREGS = "sm120_cmask_kregs"
BWD = BackwardConfig(m_block_size=64, n_block_size=64, num_threads=256, AtomLayoutMSdP=4, kernel="sm120_cmask")
FORWARD_DISPATCH: dict = {}
BACKWARD_DISPATCH: dict = {
    "d128-causal-bf16": replace(BWD, kernel=KREGS),
    "d64-causal-bf16": replace(BWD, kernel=unknown_name),
}
'''
    from search.storing.dispatch_table import entries

    read = entries(source, "bwd")
    assert read["d128-causal-bf16"]["kernel"] == "sm120_cmask_kregs" and read["d128-causal-bf16"]["num_threads"] == 256
    assert read["d64-causal-bf16"] is None  # not a literal: no entry in the search's reading, as documented
