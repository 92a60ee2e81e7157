"""Timing: summary statistics, the interleaved schedule, and the keep rule (no timing values asserted)."""

import statistics

import pytest

from fa4tune.harness import timing
from fa4tune.harness.timing import Timing


def test_summary_statistics_match_numpys_quantiles():
    numpy = pytest.importorskip("numpy")
    samples = (5.0, 1.0, 4.0, 2.0, 3.0, 10.0, 2.5)
    t = Timing(samples)
    assert t.median_ms == statistics.median(samples)
    assert (t.min_ms, t.max_ms) == (1.0, 10.0)
    assert t.q1_ms == pytest.approx(numpy.quantile(samples, 0.25))
    assert t.q3_ms == pytest.approx(numpy.quantile(samples, 0.75))
    assert t.iqr_ms == pytest.approx(t.q3_ms - t.q1_ms)
    assert t.summary()["samples"] == 7


def test_a_timing_needs_samples():
    with pytest.raises(ValueError):
        Timing(())


def test_flush_is_at_least_256_mb_and_twice_the_l2():
    assert timing.l2_flush_bytes(60 * 2**20) == 256 * 2**20  # H200: 60 MB of L2
    assert timing.l2_flush_bytes(200 * 2**20) == 400 * 2**20
    assert timing.l2_flush_bytes(None) == 256 * 2**20


def test_schedule_interleaves_shuffles_and_rotates():
    plan = timing.schedule(["a", "b", "c"], num_input_sets=3, rounds=12, seed=1)
    for r, calls in enumerate(plan):
        # every candidate on every input set once per round, a candidate's calls together
        assert sorted(calls) == sorted((n, i) for n in "abc" for i in range(3))
        assert [i for n, i in calls if n == "a"] == [(r + j) % 3 for j in range(3)]
    orders = {tuple(dict.fromkeys(n for n, _ in calls)) for calls in plan}
    assert len(orders) > 1  # the order of candidates changes between rounds
    assert timing.schedule(["a", "b", "c"], 3, 12, seed=1) == plan


class ScriptedTimer:
    """Returns a fixed time per call (by the call's own label) and records the flushes."""

    def __init__(self):
        self.flushes = 0
        self.order = []

    def time_calls(self, calls, flush=None):
        out = []
        for fn in calls:
            if flush:
                flush()
            label, ms = fn()
            self.order.append(label)
            out.append(ms)
        return out


def counted(counts):
    """call(name, ms): a scripted call that counts its runs in counts[name]."""

    def call(name, ms):
        def fn():
            counts[name] += 1
            return name, ms
        return fn

    return call


def test_benchmark_warms_up_flushes_before_every_timed_call_and_keeps_samples_apart():
    counts = {"fast": 0, "slow": 0}
    call = counted(counts)

    timer = ScriptedTimer()
    flushes = []
    result = timing.benchmark(
        {"fast": [call("fast", 1.0), call("fast", 1.2)], "slow": [call("slow", 3.0), call("slow", 3.0)]},
        timer=timer, flush=lambda: flushes.append(1), warmup=3, rounds=5, seed=0,
    )
    assert counts == {"fast": 3 + 10, "slow": 3 + 10}  # warm-up calls untimed, then rounds x input sets
    assert len(flushes) == 20
    assert result["fast"].samples_ms.count(1.0) == 5 and result["fast"].samples_ms.count(1.2) == 5
    assert result["slow"].median_ms == 3.0
    first_of_each_round = {timer.order[4 * r] for r in range(5)}
    assert first_of_each_round == {"fast", "slow"}  # interleaved: neither candidate always goes first


def test_benchmark_on_the_cpu_with_the_wall_clock_timer():
    runs = []
    result = timing.benchmark({"x": [lambda: runs.append(0)] * 2}, timer=timing.WallClockTimer(), warmup=1, rounds=3)
    assert len(result["x"].samples_ms) == 6 and all(ms >= 0 for ms in result["x"].samples_ms)


def test_benchmark_rejects_uneven_input_sets():
    with pytest.raises(ValueError):
        timing.benchmark({"a": [lambda: 0], "b": [lambda: 0, lambda: 0]}, timer=timing.WallClockTimer())


def test_a_candidate_past_its_give_up_threshold_is_timed_no_further():
    counts = {"fast": 0, "slow": 0}
    call = counted(counts)

    result = timing.benchmark(
        {"fast": [call("fast", 1.0)] * 2, "slow": [call("slow", 20.0)] * 2},
        timer=ScriptedTimer(), warmup=2, rounds=5, seed=0, give_up={"fast": 5.0, "slow": 5.0},
    )
    assert result["slow"].stopped and result["slow"].samples_ms == (20.0, 20.0)  # one round of two input sets
    assert counts["slow"] == 2 + 2
    assert not result["fast"].stopped and len(result["fast"].samples_ms) == 10 and counts["fast"] == 2 + 10
    # without a threshold (or over it only when the last round is done) a candidate is timed fully
    alone = timing.benchmark({"slow": [call("slow", 20.0)]}, timer=ScriptedTimer(), warmup=1, rounds=3, give_up={"fast": 5.0})
    assert not alone["slow"].stopped and len(alone["slow"].samples_ms) == 3
    one_round = timing.benchmark({"slow": [call("slow", 20.0)]}, timer=ScriptedTimer(), warmup=1, rounds=1, give_up={"slow": 5.0})
    assert not one_round["slow"].stopped


def test_give_up_judges_the_median_so_far():
    def call(ms):
        return lambda: ("x", ms)

    # one slow input set of three: the median (1 ms) is under the threshold, the 20 ms sample is not
    result = timing.benchmark({"x": [call(1.0), call(1.0), call(20.0)]}, timer=ScriptedTimer(), warmup=0, rounds=4,
                              give_up={"x": 5.0})
    assert not result["x"].stopped and len(result["x"].samples_ms) == 12


def test_give_up_with_the_wall_clock_timer():
    import time

    result = timing.benchmark({"fast": [lambda: None], "slow": [lambda: time.sleep(0.04)]}, timer=timing.WallClockTimer(),
                              warmup=1, rounds=3, give_up={"fast": 20.0, "slow": 20.0})
    assert result["slow"].stopped and len(result["slow"].samples_ms) == 1 and result["slow"].median_ms >= 40.0
    assert not result["fast"].stopped and len(result["fast"].samples_ms) == 3


def runs(*samples):
    return Timing(tuple(samples))


INCUMBENT = runs(10.0, 10.1, 9.9, 10.2, 9.8)  # median 10.0, IQR 0.2


def test_two_runs_that_both_beat_the_incumbent_by_more_than_the_spread_are_an_improvement():
    assert timing.is_improvement([runs(9.0, 9.1, 8.9), runs(9.2, 9.1, 9.0)], INCUMBENT)


def test_one_run_is_never_enough():
    assert not timing.is_improvement([runs(5.0, 5.0, 5.0)], INCUMBENT)


def test_both_runs_must_beat_it():
    assert not timing.is_improvement([runs(9.0, 9.0, 9.0), runs(9.95, 9.95, 9.95)], INCUMBENT)


def test_a_gain_inside_the_spread_is_noise():
    noisy = runs(8.0, 9.0, 9.5, 11.0, 12.0)  # IQR 2.0: a 0.5 ms gain is inside it
    assert not timing.is_improvement([runs(9.5, 9.5), runs(9.5, 9.5)], noisy)
    # the incumbent's run-to-run spread counts too
    two_incumbents = [runs(10.0, 10.0), runs(9.0, 9.0)]
    assert not timing.is_improvement([runs(9.0, 9.0), runs(8.9, 8.9)], two_incumbents)
    assert timing.is_improvement([runs(7.0, 7.0), runs(7.1, 7.1)], two_incumbents)
