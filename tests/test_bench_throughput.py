"""bench/throughput.py: the candidates interleave the classes, a checked result is one the gate saw, and the modes'
agreement compares the same (config, problem)."""

from types import SimpleNamespace

from bench import throughput
from fa4tune.targets import get_target


def test_candidates_interleave_classes():
    todo = throughput.candidates("standard", get_target())
    first = [pc.name for _, pc, _ in todo[:4]]
    assert len(set(first)) == 4
    assert all(problems and all(p.problem_class == pc for p in problems) for _, pc, problems in todo[:20])


def test_checked_and_agreement():
    r = lambda status, tflops=None, problem="p": SimpleNamespace(status=status, tflops=tflops, problem=problem)  # noqa: E731
    assert throughput.checked(r("ok", 1.0)) and throughput.checked(r("pruned", 1.0))
    assert not throughput.checked(r("pruned")) and not throughput.checked(r("compile_error"))
    m = lambda tflops: SimpleNamespace(config={"a": 1}, results=[r("ok", tflops)])  # noqa: E731
    assert "median 1.100" in throughput._agreement({"sequential": [m(100.0)], "default": [m(110.0)]})
    assert throughput._agreement({"default": [m(1.0)]}) == ""
