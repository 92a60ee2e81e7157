"""The TMA forward whose CTAs claim their tiles by SM (kernels/tma_smpaired_forward_sm120.py, kernel="sm120_tma_smpaired")
and its tile counter (fa4tune/tile_counter.py): registered but not searched (slower than the paired order on the GPU,
docs/measurements/2026-12-04-h200-smpaired-in-head.md); the claim protocol, replayed on the CPU, is a permutation of the
grid's tiles for any arrival order and leaves the counter zero (the kernel's reset); the counter reaches the kernel
through the patched host path (one per device and stream); and (compile-marked) an sm_120a compile of the GQA
chunked tile with its atomics in the PTX.

Whether the kernel computes the right outputs launch after launch is the GPU gate's job (bench/gpu_lpt.py `:sp`).
"""

import random
from pathlib import Path

import pytest

import experiment
from fa4tune import tile_counter
from fa4tune.config import ForwardConfig, ProblemClass
from fa4tune.kernel_class import forward_kernels
from fa4tune.space import forward_domain
from fa4tune.static_check import StaticJob, run_static
from fa4tune.targets import get_target
from kernels.tma_smpaired_forward_sm120 import TmaSmPairedForwardSm120
from search.space import get_space

ROOT = Path(__file__).resolve().parent.parent
TARGET = get_target("sm120")
GQA4_CAUSAL_CHUNKED = ProblemClass.parse("d128-causal-gqa4-chunked-bf16")


pytestmark = pytest.mark.usefixtures("this_experiment")  # tests/conftest.py


def smpaired(tile_m=64, tile_n=96, Q_in_regs=True):
    return ForwardConfig(tile_m, tile_n, 128, 1, Q_in_regs, kernel="sm120_tma_smpaired")


def test_registered_not_searched_with_a_tile_counter():
    assert forward_kernels(experiment)["sm120_tma_smpaired"] is TmaSmPairedForwardSm120
    assert "sm120_tma_smpaired" in forward_domain()["kernel"]  # the registry's domain; the search's leaves it out
    assert "sm120_tma_smpaired" not in get_space("fwd").domain["kernel"]
    assert TmaSmPairedForwardSm120.tile_counter and not forward_kernels(experiment)["sm120_tma_paired"].tile_counter


@pytest.mark.parametrize("tiles,sms", [(256, 132), (1, 1), (7, 3), (1000, 132), (600, 300)])
def test_the_claims_are_a_permutation_and_leave_the_counter_zero(tiles, sms):
    rng = random.Random(tiles * 1000 + sms)
    for _ in range(5):
        arrivals = [rng.randrange(sms) for _ in range(tiles)]
        ranks, words = tile_counter.claim_ranks(arrivals)
        assert sorted(ranks) == list(range(tiles))
        assert words == [0] * tile_counter.WORDS


def test_an_sms_first_cta_takes_the_longest_left_and_its_second_the_shortest():
    # three SMs, two CTAs each, arriving SM by SM: 0, 1, 2, then 0, 1, 2 again
    ranks, _ = tile_counter.claim_ranks([0, 1, 2, 0, 1, 2])
    assert ranks == [0, 1, 2, 5, 4, 3]
    # a counter left non-zero by a launch that died would hand out wrong ranks: the reset is what the next launch needs
    _, words = tile_counter.claim_ranks([0, 1, 2, 0, 1], total=6)  # the sixth CTA never came
    assert words[:2] == [3, 2]


def test_the_counter_is_one_per_device_and_stream_and_fresh_for_fake_tensors():
    torch = pytest.importorskip("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        like = torch.empty(4, device="cuda")
        counter = tile_counter.counter_for(like)
        assert counter.shape == (tile_counter.WORDS,) and counter.dtype == torch.int32
    cpu = tile_counter.counter_for(torch.empty(4))
    assert cpu.shape == (tile_counter.WORDS,) and not cpu.any()
    assert tile_counter.counter_for(torch.empty(4)) is not cpu  # no cache off the GPU


def test_the_host_path_passes_the_counter_only_to_a_class_that_takes_one():
    torch = pytest.importorskip("torch")
    from fa4tune.sm120_interface import build

    host = build(experiment.kernel_class)  # the pinned flash-attn-4's host path with our edits (each must match once)
    slot = host.flash_attn_fwd.__globals__["_fa4tune_counter_slot"]
    q = torch.empty(1, 8, 2, 64)
    paired = ForwardConfig(64, 96, 128, 1, True, kernel="sm120_tma_paired")
    assert slot(paired, q, None, None) is None  # upstream's value, untouched
    counter = slot(smpaired(), q, None, None)
    assert counter.shape == (tile_counter.WORDS,) and not counter.any()
    with pytest.raises(ValueError, match="cu_total_splits_m_blocks"):
        slot(smpaired(), q, torch.zeros(2, dtype=torch.int32), None)


@pytest.mark.compile
def test_gqa_chunked_tile_compiles_without_spills_at_two_ctas_per_sm(tmp_path):
    (facts,) = run_static([StaticJob("fwd", smpaired(), GQA4_CAUSAL_CHUNKED)], TARGET, ROOT / "experiment.py", workers=1,
                          cache_path=tmp_path / "facts.jsonl")
    assert facts.status == "ok", facts.reason
    assert facts.spill_store_bytes == facts.spill_load_bytes == 0
    assert facts.dynamic_smem_bytes == 49176 and facts.blocks_per_sm == 2


def test_the_pairing_model_replays_the_recorded_h200_map(capsys):
    """bench/pairing_model.py on the committed CTA-to-SM map: the busiest SM's key blocks per order, as the record
    (docs/measurements/2026-12-04-h200-smpaired-in-head.md section 2) reports them."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("pairing_model", ROOT / "bench" / "pairing_model.py")
    model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(model)
    assert model.main([]) == 0
    rows = {line.split(" | ")[0].strip("| "): int(line.split(" | ")[1]) for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ") and "order" not in line}
    assert rows == {"upstream (block index)": 171, "longest first (sm120_tma_lpt)": 171,
                    "odd rounds reversed (sm120_tma_paired)": 171, "claimed by SM (sm120_tma_smpaired)": 167}
