"""fa4tune.emulated_occupancy (opt-in, not yet run on a GPU): the padded launch size gives the emulating GPU the
target's CTAs per SM by shared memory, never less shared memory than the kernel uses, never more than a CTA may
have; nothing where the GPU has no more than the target; the variable in the kernel cache's fingerprint."""

import pytest

from fa4tune import emulated_occupancy as eo
from fa4tune.kernel_cache import ARCH_VARIABLES
from fa4tune.targets import get_target

SM120 = get_target("sm120").smem_per_sm


def ctas(smem: int, per_sm: int) -> int:
    return per_sm // (smem + eo.STATIC_SMEM + eo.RESERVED_PER_CTA)


@pytest.mark.parametrize("smem", [12288, 26624 - 1024, 37888, 50176, 65536, 74752, 82944, 99328])
@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
def test_the_gpu_then_holds_the_targets_ctas_by_shared_memory(smem, arch):
    padded = eo.padded_smem(smem, SM120, arch)
    assert padded >= smem
    assert padded + eo.STATIC_SMEM <= eo.SMEM_PER_CTA[arch]
    assert ctas(padded, eo.SMEM_PER_SM[arch]) == max(1, ctas(smem, SM120))


def test_the_d128_causal_entry_one_cta_on_an_h200_sm_as_on_sm120():
    # 50 KB dynamic + 1 KB static: 4 per H200 SM by shared memory, 1 per SM120 SM
    assert ctas(50176, eo.SMEM_PER_SM["sm_90a"]) == 4 and ctas(50176, SM120) == 1
    assert eo.padded_smem(50176, SM120, "sm_90a") == 232448 - 1024


def test_nothing_changes_where_the_gpu_has_no_more_shared_memory_than_the_target():
    for arch in ("sm_120a", "sm_89", "sm_86", "sm_75"):
        assert eo.padded_smem(50176, SM120, arch) == 50176
        assert eo.apply(SM120, arch) is False


def test_off_unless_asked_and_in_the_kernel_cache_fingerprint(monkeypatch):
    monkeypatch.delenv(eo.OCCUPANCY_ENV, raising=False)
    assert not eo.requested()
    monkeypatch.setenv(eo.OCCUPANCY_ENV, "0")
    assert not eo.requested()
    monkeypatch.setenv(eo.OCCUPANCY_ENV, "1")
    assert eo.requested()
    assert eo.OCCUPANCY_ENV in ARCH_VARIABLES
