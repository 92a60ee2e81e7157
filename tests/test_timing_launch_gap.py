"""CudaEventTimer on a simulated device whose host is slower than its kernels: the blocking kernel keeps
host launch time out of the samples, a block that runs out is caught and the round redone, and the block
follows the host's enqueue time."""

import pytest

from fa4tune.harness import timing

HOST_MS_PER_LAUNCH = 0.1  # an SM120 forward call costs the host about 0.1 ms
HOST_MS_PER_EVENT = 0.005
KERNEL_MS = (0.02, 0.04, 0.06)


class SimulatedEvent:
    """An event on the simulated stream: it completes when the stream reaches it."""

    def __init__(self, device):
        self.device, self.time = device, None

    def record(self):
        self.time = self.device.enqueue(0.0, HOST_MS_PER_EVENT)

    def query(self):
        return self.time <= self.device.host

    def elapsed_time(self, end):
        return end.time - self.time


class SimulatedDevice:
    """One stream: an op starts at max(the host time it was enqueued, the end of the previous op); the host
    clock advances by each op's launch cost."""

    def __init__(self, host_ms_per_launch=HOST_MS_PER_LAUNCH):
        self.host_ms_per_launch = host_ms_per_launch
        self.host = 0.0
        self.stream_end = 0.0
        self.blocks = []

    def enqueue(self, duration_ms, host_cost_ms):
        self.host += host_cost_ms
        start = max(self.host, self.stream_end)
        self.stream_end = start + duration_ms
        return start

    def launch(self, kernel_ms):
        self.enqueue(kernel_ms, self.host_ms_per_launch)

    def block(self, ms):
        self.blocks.append(ms)
        self.enqueue(ms, HOST_MS_PER_EVENT)

    def event(self):
        return SimulatedEvent(self)

    def synchronize(self):
        self.host = max(self.host, self.stream_end)

    def host_ms(self):
        return self.host


def kernels(device, lengths=KERNEL_MS, counts=None):
    """One call per kernel length; each launches one kernel (and counts its runs)."""
    def call(ms, i):
        def fn():
            if counts is not None:
                counts[i] += 1
            device.launch(ms)
        return fn
    return [call(ms, i) for i, ms in enumerate(lengths)]


def flush_of(device, ms=0.01):
    return lambda: device.launch(ms)


def test_without_the_block_every_sample_includes_the_hosts_launch_time():
    device = SimulatedDevice()
    timer = timing.CudaEventTimer(device, block=False)
    for flush in (None, flush_of(device)):
        samples = timer.time_calls(kernels(device), flush)
        # wrong: the device waited on the host's launch inside each pair of events
        assert all(sample > ms + HOST_MS_PER_LAUNCH / 2 for sample, ms in zip(samples, KERNEL_MS)), samples
    assert device.blocks == [] and timer.stats.rounds == 2


def test_with_the_block_every_sample_is_the_kernels_device_time():
    device = SimulatedDevice()
    timer = timing.CudaEventTimer(device)
    for _ in range(5):
        assert timer.time_calls(kernels(device), flush_of(device)) == pytest.approx(KERNEL_MS)
    assert timer.stats.rounds == 5 and timer.stats.rounds_redone == 0
    assert timer.stats.block_ms_total == pytest.approx(sum(device.blocks))


def test_a_block_that_runs_out_is_caught_and_the_round_redone():
    device = SimulatedDevice()
    timer = timing.CudaEventTimer(device, min_block_ms=0.001, initial_host_ms_per_call=0.001)
    counts = [0, 0, 0]
    samples = timer.time_calls(kernels(device, counts=counts), flush_of(device))
    assert samples == pytest.approx(KERNEL_MS)
    assert timer.stats.rounds_redone >= 1 and counts == [1 + timer.stats.rounds_redone] * 3
    assert timer.stats.blocks == 1 + timer.stats.rounds_redone


def test_the_block_follows_the_hosts_enqueue_time():
    device = SimulatedDevice()
    timer = timing.CudaEventTimer(device)
    flush = flush_of(device)
    timer.time_calls(kernels(device), flush)
    # per call the host launches a flush and a kernel and records two events
    enqueue_ms = 3 * (2 * HOST_MS_PER_LAUNCH + 2 * HOST_MS_PER_EVENT)
    assert timer.stats.last_enqueue_ms == pytest.approx(enqueue_ms)
    assert timer.block_ms_for(3) == pytest.approx(2 * enqueue_ms)
    timer.time_calls(kernels(device), flush)
    assert device.blocks[-1] == pytest.approx(2 * enqueue_ms)

    device.host_ms_per_launch = 0.5  # the host slows down: the old block runs out once, then the block grows
    assert timer.time_calls(kernels(device), flush) == pytest.approx(KERNEL_MS)
    assert timer.stats.rounds_redone == 1
    assert timer.time_calls(kernels(device), flush) == pytest.approx(KERNEL_MS)
    assert timer.stats.rounds_redone == 1 and device.blocks[-1] > 4 * enqueue_ms

    device.host_ms_per_launch = 0.05  # and shrinks again when the host speeds up
    timer.time_calls(kernels(device), flush)
    assert timer.time_calls(kernels(device), flush) == pytest.approx(KERNEL_MS)
    assert device.blocks[-1] < 2 * enqueue_ms and timer.stats.rounds_redone == 1


def test_the_block_has_a_floor():
    device = SimulatedDevice(host_ms_per_launch=0.0)
    timer = timing.CudaEventTimer(device, min_block_ms=0.25)
    timer.time_calls(kernels(device))
    timer.time_calls(kernels(device))
    assert device.blocks[-1] == 0.25


def test_a_call_that_waits_for_the_device_is_an_error_naming_the_rule_after_the_retries():
    device = SimulatedDevice()
    timer = timing.CudaEventTimer(device, max_redos=3)

    def synchronizing():
        device.launch(0.04)
        device.synchronize()  # e.g. .item(): the host waits, so the block always runs out

    with pytest.raises(timing.TimingError, match="block_covers_enqueue"):
        timer.time_calls([synchronizing, synchronizing])
    assert timer.stats.rounds_redone == 3 and timer.stats.blocks == 4 and timer.stats.rounds == 0
    assert device.blocks == sorted(device.blocks) and device.blocks[-1] >= 8 * device.blocks[0]  # lengthened each try


def test_benchmark_through_the_blocking_timer_gives_each_candidates_kernel_time():
    device = SimulatedDevice()
    candidates = {
        "short": [lambda: device.launch(0.02)] * 3,
        "long": [lambda: device.launch(0.06)] * 3,
    }
    result = timing.benchmark(candidates, timer=timing.CudaEventTimer(device), flush=flush_of(device), rounds=6)
    assert result["short"].max_ms == pytest.approx(0.02) and result["long"].min_ms == pytest.approx(0.06)
    before = timing.benchmark(candidates, timer=timing.CudaEventTimer(device, block=False), flush=flush_of(device), rounds=6)
    assert before["short"].median_ms > 0.02 + 0.05  # the old schedule measures the host
