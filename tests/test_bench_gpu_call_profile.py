"""bench/gpu_call_profile.py: calls split at the host's gaps, each call's span from its first kernel to its last."""

from bench import gpu_call_profile


def test_calls_split_at_gaps_longer_than_any_within_a_call():
    kernels = [(0, 10), (15, 40), (45, 50),  # call 1: 50 µs, gaps of 5
               (400, 420), (430, 431),       # call 2: 31 µs
               (1000, 1005)]                 # call 3: one kernel
    assert gpu_call_profile.call_spans(kernels) == [50, 31, 5]
    assert gpu_call_profile.call_spans(kernels, gap_us=1000) == [1005]
    assert gpu_call_profile.call_spans([]) == []
