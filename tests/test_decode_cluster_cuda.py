"""bench/decode_cluster_cuda.py, the one-kernel cluster decode prototype, builds for sm_120a on this CPU (NVRTC, from
the torch wheel) within SM120's rules: no spills, no stack, 512 threads at one CTA per SM, and dynamic shared memory
under the 99 KB opt-in; its merge is on chip (cluster barrier and distributed shared memory, no global atomics). Its
arithmetic is checked against torch on the GPU (bench/gpu_decode_floor.py --cluster-cuda), not here."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import decode_cluster_cuda as proto  # noqa: E402

from fa4tune.cubin import read_cubin  # noqa: E402

SM120_SMEM_PER_BLOCK = 99 * 1024


@pytest.mark.compile
@pytest.mark.parametrize("variant", sorted(proto.VARIANTS))
def test_builds_for_sm120a_without_spills(variant):
    facts = read_cubin(proto.cubin(variant, "120a"))
    assert facts.spill_store_bytes == facts.spill_load_bytes == facts.stack_bytes == facts.local_bytes == 0, facts
    assert facts.registers * proto.WARPS * 32 <= 64 * 1024, facts  # one CTA of 512 threads fits the register file
    assert facts.static_smem_bytes + proto.smem_bytes(proto.VARIANTS[variant]["SA"]) <= SM120_SMEM_PER_BLOCK


def test_merge_is_on_chip():
    ptx_like = proto.source(**proto.VARIANTS["math"])
    assert "__cluster_dims__(CL, 1, 1)" in ptx_like and "#define CL 8" in ptx_like
    assert "mapa.shared::cluster" in ptx_like and "barrier.cluster.arrive" in ptx_like
    assert "atom" not in ptx_like and "red." not in ptx_like


def test_bad_layouts_are_refused():
    with pytest.raises(AssertionError):
        proto.source(RA=12, SA=4, MATH=1)  # the warps' partials need SA >= 8 keys of stage
    with pytest.raises(AssertionError):
        proto.source(RA=10, SA=12, MATH=1)  # four keys per step
    assert proto.smem_bytes(12) == 16 * 12 * 2 * 256 + (4 * 128 + 8) * 4
