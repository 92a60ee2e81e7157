"""The compile pipeline with a fake slow compiler: compiles run ahead in parallel processes, the consumer (the
GPU's place) never waits while a compiled candidate is ready, and compile failures never reach it."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from search.evaluating.pipeline import CompilePool, Pipeline

FAKE = "pipeline_fakes:slow_compile"
TESTS = str(__import__("pathlib").Path(__file__).resolve().parent)
COMPILE_S, EVALUATE_S = 0.6, 0.15  # compiling is the slow part, as with the real kernels
SLACK_S = 0.3  # thread wake-ups on a loaded 2-core machine


def _pool(jobs: int, timeout_s: float = 60.0) -> CompilePool:
    return CompilePool(FAKE, jobs, sys_path=[TESTS], timeout_s=timeout_s)


def _run(jobs: list[dict], compilers: int, in_flight: int):
    evaluated: list[int] = []
    lock = threading.Lock()

    def evaluate(batch, done):
        for item in batch:
            time.sleep(EVALUATE_S)
            with lock:
                evaluated.append(item.job["id"])
            done(item, {"measured": item.job["id"]})

    pipeline = Pipeline(_pool(compilers), evaluate, ready_capacity=4, max_batch=4)
    start = time.monotonic()
    try:
        with ThreadPoolExecutor(in_flight) as slots:  # one thread per trial in flight, as a worker's slots
            results = list(slots.map(pipeline.run, jobs))
    finally:
        pipeline.close()
    return results, evaluated, pipeline.stats, time.monotonic() - start


def test_the_consumer_never_waits_while_a_compiled_candidate_is_ready_and_failures_never_reach_it():
    jobs = [{"id": i, "compile_s": COMPILE_S, "fail": i % 5 == 3} for i in range(16)]
    results, evaluated, stats, wall = _run(jobs, compilers=4, in_flight=7)

    failed = {j["id"] for j in jobs if j["fail"]}
    assert sorted(evaluated) == sorted(j["id"] for j in jobs if not j["fail"])  # each once, no failure
    for job, (compiled, measured) in zip(jobs, results):
        assert (measured is None) == job["fail"]
        assert compiled["status"] == ("compile_error" if job["fail"] else "ok")
    assert stats.skipped == len(failed)

    # Hand-off: a candidate that became ready while the consumer was idle was taken at once; one that became
    # ready while it worked was taken when that batch ended.
    batches = sorted(stats.batches)
    for ready_at, taken_at in stats.handoffs:
        busy = next(((s, e) for s, e, _ in batches if s <= ready_at < e), None)
        expected = busy[1] if busy else ready_at
        assert taken_at - expected < SLACK_S, (ready_at, taken_at, busy)
    # Every wait of the consumer began with nothing ready.
    for wait_start, wait_end in stats.waits:
        assert not [r for r, t in stats.handoffs if r < wait_start - 0.01 and t >= wait_end], (wait_start, wait_end)

    # Compiles overlap each other and the evaluations: far below compile + evaluate one after another.
    sequential = len(jobs) * COMPILE_S + len(evaluated) * EVALUATE_S
    assert wall < 0.6 * sequential, (wall, sequential)
    # After the first candidate, the consumer starved only briefly (4 compilers outpace it).
    first = batches[0][0]
    idle_after_first = sum(e - s for s, e in stats.waits if s >= first)
    assert idle_after_first < 0.35 * (batches[-1][1] - first), (idle_after_first, stats.waits)


def test_a_compile_past_the_time_limit_or_a_dead_compiler_is_a_compile_error_and_the_pool_goes_on():
    pool = _pool(2, timeout_s=1.0)
    try:
        slow = pool.submit({"id": 0, "compile_s": 30})
        crash = pool.submit({"id": 1, "compile_s": 0.0, "crash": True})
        after = [pool.submit({"id": i, "compile_s": 0.05}) for i in range(2, 6)]
        assert "compile ran past 1 s" in slow.result(timeout=30)["reason"]
        assert "compiler process died" in crash.result(timeout=30)["reason"]
        assert [f.result(timeout=30)["status"] for f in after] == ["ok"] * 4
    finally:
        pool.close()
