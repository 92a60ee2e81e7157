"""Turn policies and credit per proposer, on hand-made histories and through the report."""

from __future__ import annotations

from search.proposing.credit import credit
from search.proposing.scripted import ScriptedProposer
from search.proposing.turns import Adaptive, FixedRatio, parse_ratio
from search.reviewing.report import print_study
from search.storing.history import TrialRecord
from search_helpers import make_loop, write_table


def _r(number, proposer, value=None, status="ok", evaluated=True, **kw) -> TrialRecord:
    status = status if value is not None or status != "ok" else "incorrect"
    return TrialRecord(number, "COMPLETE", proposer, {"n": number}, status, value, evaluated=evaluated, **kw)


HISTORY = [
    _r(0, "baseline", 100.0),
    _r(1, "tpe", 90.0),
    _r(2, "claude", 120.0),  # improvement
    _r(3, "claude", 110.0),
    _r(4, "tpe", None, status="infeasible", evaluated=False),
    _r(5, "tpe", 130.0),  # improvement
    _r(6, "claude", 150.0),  # improvement, the best
    _r(7, "tpe", 150.0, evaluated=False, duplicate_of=6),  # a copy: no credit
    _r(8, "confirmation", 149.0, confirmation_of=6, confirmed=True),  # not a search trial
]


def test_credit_counts_trials_improvements_and_the_best_per_proposer():
    c = credit(HISTORY)
    assert set(c) == {"baseline", "tpe", "claude"}
    assert (c["claude"].trials, c["claude"].evaluated, c["claude"].improvements, c["claude"].best, c["claude"].holds_best) == (3, 3, 2, 150.0, True)
    assert (c["tpe"].trials, c["tpe"].evaluated, c["tpe"].infeasible, c["tpe"].improvements, c["tpe"].best, c["tpe"].holds_best) == (4, 2, 1, 1, 130.0, False)
    assert (c["baseline"].improvements, c["baseline"].holds_best) == (1, False)


def test_a_fixed_ratio_gives_trials_in_proportion():
    policy = FixedRatio(parse_ratio("2:1", "tpe", "claude"))
    history: list[TrialRecord] = []
    for n in range(30):
        history.append(_r(n, policy.next(history, ["tpe", "claude"]), 1.0))
    assert sum(r.proposer == "tpe" for r in history) == 20


def test_an_unavailable_proposer_leaves_its_turns_to_the_sampler():
    policy = FixedRatio({"tpe": 1, "claude": 1})
    assert {policy.next([_r(i, "tpe", 1.0) for i in range(5)], ["tpe"]) for _ in range(3)} == {"tpe"}


def test_the_adaptive_policy_gives_more_turns_to_who_found_the_recent_improvements():
    improving_claude = [_r(i, "claude" if i % 2 else "tpe", float(i if i % 2 else 1)) for i in range(10)]
    fixed, adaptive = FixedRatio({"tpe": 1, "claude": 1}), Adaptive({"tpe": 1, "claude": 1}, window=10)
    assert fixed.next(improving_claude, ["tpe", "claude"]) == "tpe"  # even shares: tpe's turn
    assert adaptive.next(improving_claude, ["tpe", "claude"]) == "claude"
    history = list(improving_claude)
    for n in range(10, 30):
        history.append(_r(n, adaptive.next(history, ["tpe", "claude"]), 0.5))
    assert sum(r.proposer == "claude" for r in history[10:]) > 10


def test_the_report_prints_credit_per_proposer(capsys):
    print_study("fwd:d128-causal-bf16:sm120", {"rejected_proposals": {"claude": 3}}, HISTORY, None)
    out = capsys.readouterr().out
    claude = next(line for line in out.splitlines() if line.strip().startswith("claude"))
    assert claude.split()[:7] == ["claude", "3", "3", "0", "3", "2", "150.0"] and "holds the best" in claude
    assert "best   #6 150.0 TFLOPS by claude, 1.50x upstream's default (100.0)" in out
    assert "winner #6 confirmed 1 times (149.0)" in out


def test_a_loop_with_a_scripted_proposer_records_who_made_each_trial(tmp_path):
    script = [{"tile_m": 128, "tile_n": 128, "num_threads": 256, "num_stages": 1, "Q_in_regs": False, "kernel": "sm120"},
              {"tile_m": 128, "tile_n": 96, "num_threads": 256, "num_stages": 1, "Q_in_regs": False, "kernel": "sm120"}]
    loop, _, view = make_loop(write_table(tmp_path), proposers=[ScriptedProposer(script)], n_trials=6, k=2, confirmations=0)
    loop.run()
    made = {t.number: t.user_attrs["proposer"] for t in loop.study.trials}
    assert made[0] == "baseline" and list(made.values()).count("scripted") == 2
    assert view.turns.count("scripted") >= 1
    assert {t.user_attrs["rationale"] for t in loop.study.trials if t.user_attrs["proposer"] == "scripted"} == {"scripted"}
