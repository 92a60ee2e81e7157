"""fa4tune.harness.steps.measure_step in this process (CPU): the gate first, then timing; a candidate past its give-up
threshold is `pruned` with what was measured."""

import re

import torch

from fa4tune.config import Problem
from fa4tune.harness import steps
from fa4tune.harness.measurement import STATUSES
from fa4tune.harness.settings import Settings
from tests import prepare_child_targets as targets

torch.set_num_threads(1)

SMALL = Problem(1, 48, 48, 2, 2, 32, 32, True, backward=False, name="tiny causal")
SETTINGS = Settings(gate_seed=7, warmup=1, rounds=4, input_sets=2, gate_random_problems=1)


def test_a_candidate_past_the_give_up_threshold_is_pruned_with_what_was_measured():
    candidates = [targets.slow_candidate(), targets.correct_candidate(), targets.wrong_candidate()]
    results = steps.measure_step(SMALL, "fwd", candidates, device="cpu", settings=SETTINGS, give_up_ms=50.0)
    slow, fast, wrong = results["slow"], results["correct"], results["wrong"]
    assert "pruned" in STATUSES
    assert slow.status == "pruned" and slow.tflops > 0 and slow.ms_median >= 100.0 and slow.max_errors["out"] >= 0
    assert re.fullmatch(r"stopped after 2 samples: median \d+(\.\d+)? ms > 50 ms \(give-up threshold\)", slow.reason), slow.reason
    assert fast.status == "ok" and fast.reason == ""
    # the gate runs first: a wrong candidate is incorrect, never timed, whatever its speed
    assert wrong.status == "incorrect" and wrong.ms_median is None


def test_without_a_threshold_every_candidate_is_timed_fully():
    timer = CountingTimer()
    results = steps.measure_step(SMALL, "fwd", [targets.slow_candidate()], device="cpu", settings=SETTINGS, timer=timer)
    assert results["slow"].status == "ok" and timer.calls == SETTINGS.rounds * SETTINGS.input_sets


class CountingTimer:
    """Times nothing: each call counts and takes 100 ms on paper."""

    def __init__(self):
        self.calls = 0

    def time_calls(self, calls, flush=None):
        for fn in calls:
            fn()
        self.calls += len(calls)
        return [100.0] * len(calls)
