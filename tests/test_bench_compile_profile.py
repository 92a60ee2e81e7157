"""bench/compile_profile.py's timer: a wrapped method's wall time adds up once per outermost call, also when the
call recurses or raises (the DSL's trace calls itself for nested jit functions). A fake clock, no sleeping."""

from types import SimpleNamespace

import pytest

from bench import compile_profile

CLOCK = [0.0]


class Tracer:
    def trace(self, depth: int) -> int:
        CLOCK[0] += 1.0  # each level works one second
        return depth if depth == 0 else self.trace(depth - 1)

    def fail(self) -> None:
        CLOCK[0] += 0.5
        raise RuntimeError("compile error")


def test_nested_calls_count_once_and_a_raising_call_still_counts(monkeypatch):
    monkeypatch.setattr(compile_profile, "time", SimpleNamespace(perf_counter=lambda: CLOCK[0]))
    bench, bucket = compile_profile, {}
    bench.timed(Tracer, "trace", bucket, "trace")
    bench.timed(Tracer, "fail", bucket, "backend")
    assert Tracer().trace(3) == 0
    assert bucket["trace"] == pytest.approx(4.0)  # the outermost call's 4 s, not each level's running total (10 s)
    with pytest.raises(RuntimeError, match="compile error"):
        Tracer().fail()
    assert bucket["backend"] == pytest.approx(0.5)
    Tracer().trace(0)
    assert bucket["trace"] == pytest.approx(5.0)  # a second outermost call adds up
