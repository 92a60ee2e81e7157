"""fa4tune.emulated_occupancy: the padded launch size gives the emulating GPU the target's CTAs per SM by shared
memory, never less shared memory than the kernel uses, never more than a CTA may have; nothing where the GPU has no
more than the target (SM120 itself, the sm_120a static check); on unless FA4TUNE_EMULATE_OCCUPANCY=0; the setting in
the kernel cache's fingerprint and in the run's label. On the H200 it was shown to take effect
(docs/measurements/2026-12-02-h200-target-occupancy.md)."""

import pytest

from fa4tune import emulated_occupancy as eo
from fa4tune import kernel_cache
from fa4tune.targets import get_target

SM120 = get_target("sm120").smem_per_sm
# The hardware's numbers, written here apart from the module's constants (CUDA C++ Programming Guide, compute
# capabilities table): shared memory per SM and the most one CTA may opt in to; the driver keeps 1 KB per CTA.
HARDWARE = {"sm_90a": (228 * 1024, 227 * 1024), "sm_80": (164 * 1024, 163 * 1024)}
RESERVED = 1024


def ctas(smem: int, per_sm: int) -> int:
    return per_sm // (smem + RESERVED)


def test_sm120_has_100_kb_per_sm():
    assert SM120 == 100 * 1024


@pytest.mark.parametrize("smem", [12288, 26624 - 1024, 37888, 50176, 65536, 74752, 82944, 99328])
@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
def test_the_gpu_then_holds_the_targets_ctas_by_shared_memory(smem, arch):
    per_sm, per_cta = HARDWARE[arch]
    padded = eo.padded_smem(smem, SM120, arch)
    assert padded >= smem
    assert padded <= per_cta
    assert ctas(padded, per_sm) == max(1, ctas(smem, SM120))


def test_a_49_kb_cta_two_on_an_h200_sm_as_on_sm120():
    # 49 KB dynamic + the reserved KB: 4 per H200 SM by shared memory, 2 per SM120 SM (102,400 B = 2 x 51,200).
    # The driver's own count on the H200 (docs/measurements/2026-12-03-h200-smem-accounting.md): 2 CTAs per SM at
    # 115,712 B dynamic, the padded size.
    assert ctas(50176, HARDWARE["sm_90a"][0]) == 4 and ctas(50176, SM120) == 2
    assert eo.padded_smem(50176, SM120, "sm_90a") == 115712


def test_one_kb_more_is_one_cta_per_sm120_sm():
    assert ctas(50177, SM120) == 1 and eo.padded_smem(50177, SM120, "sm_90a") == 232448


@pytest.mark.parametrize("arch", ["sm_120a", "sm_89", "sm_86", "sm_75"])
def test_nothing_changes_where_the_gpu_has_no_more_shared_memory_than_the_target(arch, monkeypatch):
    assert eo.padded_smem(50176, SM120, arch) == 50176
    monkeypatch.delenv(eo.OCCUPANCY_ENV, raising=False)
    monkeypatch.setenv("CUTE_DSL_ARCH", arch)
    assert eo.launch_smem(50176, SM120) == 50176


def test_on_by_default_off_with_zero_and_decided_at_each_build(monkeypatch):
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    monkeypatch.delenv(eo.OCCUPANCY_ENV, raising=False)
    assert eo.requested() and eo.launch_smem(50176, SM120) == 115712
    assert "SM120's CTAs per SM" in eo.describe("SM120")
    for off in ("0", "false", "OFF", " no "):
        monkeypatch.setenv(eo.OCCUPANCY_ENV, off)
        assert not eo.requested() and eo.launch_smem(50176, SM120) == 50176
        assert f"{eo.OCCUPANCY_ENV}=0" in eo.describe("SM120")
    monkeypatch.setenv(eo.OCCUPANCY_ENV, "1")
    assert eo.launch_smem(50176, SM120) == 115712


def test_no_arch_known_pads_nothing(monkeypatch):
    monkeypatch.delenv("CUTE_DSL_ARCH", raising=False)
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert eo.arch_here() is None and eo.launch_smem(50176, SM120) == 50176


def test_an_arch_the_table_does_not_know_is_not_padded_and_its_runs_say_so(monkeypatch):
    monkeypatch.delenv(eo.OCCUPANCY_ENV, raising=False)
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_110a")  # not in the table
    assert eo.launch_smem(50176, SM120) == 50176
    assert eo.regime() == eo.DEVICE and "sm_110a" in eo.describe("SM120") and "not padded" in eo.describe("SM120")
    for known in ("sm_90a", "sm_120a"):  # padded, or nothing to pad: the target's CTAs per SM either way
        monkeypatch.setenv("CUTE_DSL_ARCH", known)
        assert eo.regime() == eo.TARGET and "SM120's CTAs per SM" in eo.describe("SM120")


def test_the_setting_is_in_the_kernel_cache_fingerprint(monkeypatch, tmp_path):
    module = tmp_path / "kernels.py"
    module.write_text("# a kernel module\n")
    monkeypatch.delenv(eo.OCCUPANCY_ENV, raising=False)
    default = kernel_cache.fingerprint(str(module), "sm_90a")
    monkeypatch.setenv(eo.OCCUPANCY_ENV, "1")
    assert kernel_cache.fingerprint(str(module), "sm_90a") == default  # the same setting, the same cache
    monkeypatch.setenv(eo.OCCUPANCY_ENV, "0")
    assert kernel_cache.fingerprint(str(module), "sm_90a") != default


def test_the_launch_the_dsl_builds_is_padded_once(monkeypatch):
    from cutlass.cutlass_dsl.cutlass import KernelLauncher

    seen = []
    monkeypatch.setattr(KernelLauncher, "launch", lambda self, *a, **kw: seen.append(kw["smem"]))
    eo.install(SM120)
    eo.install(SM120)  # one padding, never two (a 2-CTA size padded twice would become 1 CTA)
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    monkeypatch.delenv(eo.OCCUPANCY_ENV, raising=False)
    KernelLauncher.launch(object(), grid=[1, 1, 1], smem=37888)
    KernelLauncher.launch(object(), grid=[1, 1, 1], smem=50176)
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_120a")
    KernelLauncher.launch(object(), grid=[1, 1, 1], smem=50176)
    assert seen == [eo.padded_smem(37888, SM120, "sm_90a"), 115712, 50176]
    assert ctas(seen[0], eo.SMEM_PER_SM["sm_90a"]) == 2


@pytest.mark.parametrize("setting, expected", [(None, "target"), ("0", "device")])
def test_an_emulated_trial_records_the_occupancy_it_ran_at(setting, expected, monkeypatch):
    from fa4tune.harness.measurement import Measurement
    from search.running.loop import measurement_attrs
    from search.storing import schema

    if setting is None:
        monkeypatch.delenv(eo.OCCUPANCY_ENV, raising=False)
    else:
        monkeypatch.setenv(eo.OCCUPANCY_ENV, setting)
    emulated = Measurement("fwd", "d128-causal-bf16", {}, (), "sm120", "NVIDIA H200", "emulated")
    assert measurement_attrs(emulated)[schema.OCCUPANCY] == expected
    native = Measurement("fwd", "d128-causal-bf16", {}, (), "sm120", "NVIDIA GeForce RTX 5090", "native")
    assert schema.OCCUPANCY not in measurement_attrs(native)  # SM120 itself: its own occupancy is the target's


def _study_with_one_emulated_trial(url: str, occupancy: str | None):
    import optuna

    from search.storing import schema
    from search.storing.storage import open_storage
    from search_helpers import spec

    s = spec()
    study = optuna.create_study(study_name=s.name, storage=open_storage(url), direction="maximize")
    for key, value in s.user_attrs().items():
        study.set_user_attr(key, value)
    attrs = {schema.EVALUATED: True, schema.MODE: "emulated", **({schema.OCCUPANCY: occupancy} if occupancy else {})}
    study.add_trial(optuna.trial.create_trial(value=250.0, user_attrs=attrs))
    return s


@pytest.mark.parametrize("stored, this_run, refused", [
    (None, "target", True),  # a study from before the padding, resumed with the padding on
    ("device", "target", True), ("target", "device", True),
    ("target", "target", False), (None, "device", False), (None, "", False),  # "": not emulated (SM120, replay)
])
def test_a_study_measured_at_another_occupancy_is_refused(tmp_path, stored, this_run, refused):
    from fa4tune.config import ConfigError
    from search.storing.storage import open_storage
    from search.storing.study import check_existing

    url = f"sqlite:///{tmp_path / 'search.db'}"
    s = _study_with_one_emulated_trial(url, stored)
    if not refused:
        check_existing(open_storage(url), [s], this_run)
        return
    with pytest.raises(ConfigError) as err:
        check_existing(open_storage(url), [s], this_run)
    assert err.value.rule == "study_occupancy" and s.name in str(err.value) and "FA4TUNE_EMULATE_OCCUPANCY" in str(err.value)


def test_only_an_emulating_evaluator_has_an_occupancy(monkeypatch):
    from search.evaluating.protocol import occupancy_of

    monkeypatch.delenv(eo.OCCUPANCY_ENV, raising=False)
    assert occupancy_of(type("E", (), {"mode": "emulated"})()) == "target"
    assert occupancy_of(type("N", (), {"mode": "native"})()) == ""
    assert occupancy_of(object()) == ""  # a replay evaluator has no mode
