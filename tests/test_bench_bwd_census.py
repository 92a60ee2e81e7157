"""bench/bwd_census.py --summary on the committed census (search/data/bwd_census.jsonl): no compile contradicts the
backward rules, and each class's summary is printed."""

from bench_helpers import run_script


def test_the_committed_census_has_no_contradiction():
    done = run_script("bwd_census", "--summary", "--classes", "d128-causal-bf16", timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert " 0 contradictions" in done.stdout
