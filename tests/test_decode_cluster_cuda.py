"""bench/decode_cluster_cuda.py, the one-kernel cluster decode prototype, builds for sm_120a on this CPU (NVRTC, from
the torch wheel) within SM120's rules: one CTA per SM by registers (spilling at most a few words at 255), dynamic
shared memory under the 99 KB opt-in; its merge is on chip (cluster barrier and distributed shared memory, no global atomics). Its
arithmetic is checked against torch on the GPU (bench/gpu_decode_floor.py --cluster-cuda), not here."""

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import decode_cluster_cuda as proto  # noqa: E402

from fa4tune.cubin import read_cubin  # noqa: E402

SM120_SMEM_PER_BLOCK = 99 * 1024
SM120_REGISTERS_PER_SM = 64 * 1024


@pytest.mark.compile
@pytest.mark.parametrize("variant", sorted(proto.VARIANTS))
def test_builds_for_sm120a_without_spills(variant):
    spec = proto.VARIANTS[variant]
    facts = read_cubin(proto.cubin(variant, "120a"))
    # The mma layout runs at 255 registers, 160 of them a tile's K and V in flight: ptxas spills a word or three
    # there, and which ones moves with unrelated edits (mma 0 or 8 B, mma_floor 12 B on 2026-12-04); a blow-up would not
    # pass. The fma layout has room and spills nothing.
    limit = 16 if spec.layout == "mma" else 0
    assert facts.spill_store_bytes <= limit and facts.spill_load_bytes <= limit and facts.local_bytes == 0, facts
    assert facts.registers * spec.warps * 32 <= SM120_REGISTERS_PER_SM, facts
    assert facts.static_smem_bytes + spec.smem_bytes <= SM120_SMEM_PER_BLOCK, (facts, spec.smem_bytes)


@pytest.mark.parametrize("variant", sorted(proto.VARIANTS))
def test_merge_is_on_chip(variant):
    spec = proto.VARIANTS[variant]
    source = spec.source()
    assert "__cluster_dims__(CL, 1, 1)" in source and "#define CL 8" in source
    assert "mapa.shared::cluster" in source and "barrier.cluster.arrive" in source
    # only the `_floor_local` floors build without the cluster merge, and no math variant does
    assert f"#define CLUSTER_MERGE {int(spec.cluster_merge)}" in source
    assert spec.cluster_merge == (not variant.endswith("_local")) and (spec.cluster_merge or not spec.math)
    assert not re.search(r"\b(atom|red)\.|atomic", source)  # no merge through global memory
    assert "__" + "MATH__" not in source and "__RA__" not in source and "__SA__" not in source
    assert "__CLUSTER" + "_MERGE__" not in source


def test_bad_layouts_are_refused():
    with pytest.raises(AssertionError, match="SA >= 8"):
        proto.Variant("fma", True, SA=4).source()  # the warp's partial overlays its stage
    with pytest.raises(AssertionError, match="multiples of 4"):
        proto.Variant("fma", True, RA=10).source()
    with pytest.raises(AssertionError, match="only a floor variant may skip the cluster merge"):
        proto.Variant("mma", True, cluster_merge=False).source()
    with pytest.raises(AssertionError, match="read layout: a floor"):
        proto.Variant("read", True, threads=512, loads=8).source()  # a read floor has no math to check
    with pytest.raises(AssertionError, match="whole warps"):
        proto.Variant("read", False, threads=100, loads=8).source()
    read = proto.VARIANTS["read_1024x8"]
    assert read.warps == 32 and read.smem_bytes == 33 * proto.PARTIAL_BYTES  # 32 warps' partials, then the CTA's
    assert "#define NT 1024" in read.source() and "#define NL 8" in read.source()
    assert proto.Variant("fma", True).smem_bytes == 16 * 12 * 2 * 256 + proto.PARTIAL_BYTES
    assert proto.Variant("mma", True).smem_bytes == 8 * 3 * 8 * 32 * 16 + proto.PARTIAL_BYTES
