"""SM120's CTAs per SM, reproduced on a GPU with more shared memory per SM (on by default under emulation).

An SM120 SM has 100 KB of shared memory (fa4tune.targets: `smem_per_sm`), an H200's 228 KB. Under emulation a CTA
of 51-66 KB runs 2-3 times per H200 SM (the registers allowing) but once per SM120 SM, so the H200 ranked configs by
an occupancy SM120 cannot give them (docs/measurements/2026-12-01-occupancy-gap.md). So every DSL kernel launch built
for an arch with more shared memory per SM than the target asks for more dynamic shared memory than it uses: as much
as makes the GPU fit exactly the target's number of CTAs by shared memory. The kernel's code and its shared storage are
unchanged (the rules read the traced storage, not the launch), and the registers then limit both GPUs alike (the same
64K register file). On an SM120 GPU (and in the sm_120a static check) nothing changes.

`FA4TUNE_EMULATE_OCCUPANCY=0` turns it off (the emulating GPU's own occupancy, as every run before 2026-12-02 had).
The padded size is part of the compiled host code, so the setting is in the kernel cache's fingerprint. Shown on
the H200: docs/measurements/2026-12-02-h200-target-occupancy.md (the d128 causal TMA 64x64 entry, 3 CTAs per SM
there, went from 0.454 to 0.627 ms at the 1 CTA per SM this module then gave it; SM120 gives it 2: until 2026-12-03
the reserved kilobyte was counted twice, docs/measurements/2026-12-03-h200-smem-accounting.md).

A preferred shared-memory carveout (CUDA's hint) was tried first and had no measurable effect on the H200.
"""

from __future__ import annotations

import functools
import os

OCCUPANCY_ENV = "FA4TUNE_EMULATE_OCCUPANCY"
RESERVED_PER_CTA = 1024  # shared memory the driver keeps per CTA (both arches)
# The DSL kernels declare no static shared memory (ptxas: 0 B). The 1 KB their cubins show in cuobjdump's SHARED is
# the reserved kilobyte above, counted once by the driver (docs/measurements/2026-12-03-h200-smem-accounting.md); until
# 2026-12-03 it was counted here a second time, which gave kernels near a boundary one CTA per SM fewer than SM120.

# Per SM / per CTA shared memory by the arch kernels are compiled for (CUDA C++ Programming Guide, its table of
# technical specifications per compute capability), bytes. An arch missing here is not padded, and its runs say so.
_KB = 1024
_PER_SM_KB = {"sm_80": 164, "sm_86": 100, "sm_87": 164, "sm_89": 100, "sm_90": 228, "sm_100": 228, "sm_103": 228,
              "sm_120": 100, "sm_121": 100}
SMEM_PER_SM = {arch + a: kb * _KB for arch, kb in _PER_SM_KB.items() for a in ("", "a")}
SMEM_PER_CTA = {arch: per_sm - _KB for arch, per_sm in SMEM_PER_SM.items()}  # the opt-in maximum: 1 KB less


def padded_smem(smem: int, target_smem_per_sm: int, arch: str) -> int:
    """The dynamic shared memory to launch a kernel that uses `smem` with, so that `arch` holds as many CTAs by
    shared memory as the target does; `smem` itself where `arch` has no more than the target (or is unknown)."""
    device = SMEM_PER_SM.get(arch)
    if device is None or device <= target_smem_per_sm:
        return smem
    per_cta = smem + RESERVED_PER_CTA
    on_target = max(1, target_smem_per_sm // per_cta)
    if device // per_cta <= on_target:
        return smem
    return max(smem, min(device // on_target, SMEM_PER_CTA[arch] + RESERVED_PER_CTA) - RESERVED_PER_CTA)


OFF_VALUES = ("0", "false", "off", "no")


def requested() -> bool:
    """Whether this process pads launches to the target's occupancy: yes unless FA4TUNE_EMULATE_OCCUPANCY is 0."""
    return os.environ.get(OCCUPANCY_ENV, "1").strip().lower() not in OFF_VALUES


TARGET, DEVICE = "target", "device"  # the occupancy an emulated measurement ran at


def unknown_arch() -> str | None:
    """This process's arch where SMEM_PER_SM does not know it (its launches cannot be padded), else None."""
    arch = arch_here()
    return arch if arch is not None and arch not in SMEM_PER_SM else None


def regime() -> str:
    """TARGET when this process pads launches to the target's CTAs per SM, else DEVICE (padding off, or an arch
    whose shared memory per SM is not known)."""
    return TARGET if requested() and unknown_arch() is None else DEVICE


def describe(target_name: str) -> str:
    """How an emulated run's occupancy was set, for its labels."""
    if not requested():
        return f"at this GPU's CTAs per SM ({OCCUPANCY_ENV}=0)"
    arch = unknown_arch()
    if arch is not None:
        return (f"at this GPU's CTAs per SM: the shared memory per SM of {arch} is not in "
                "fa4tune/emulated_occupancy.py's table, so launches are not padded")
    return f"at {target_name}'s CTAs per SM (launch shared memory padded)"


def compile_arch() -> str:
    """The arch kernels are compiled for here: CUTE_DSL_ARCH, else the GPU's, named as the DSL names it."""
    if os.environ.get("CUTE_DSL_ARCH"):
        return os.environ["CUTE_DSL_ARCH"]
    import torch

    major, minor = torch.cuda.get_device_capability()
    return device_arch(major, minor)


def device_arch(major: int, minor: int) -> str:
    """The DSL's name of a compute capability: 'sm_90a' for 9.0, 'sm_120a' for 12.0, 'sm_80' for 8.0."""
    return f"sm_{major}{minor}{'a' if major >= 9 else ''}"


def arch_here() -> str | None:
    """The arch this process compiles kernels for (compile_arch); None with no CUTE_DSL_ARCH and no GPU."""
    if not os.environ.get("CUTE_DSL_ARCH"):
        import torch

        if not torch.cuda.is_available():
            return None
    return compile_arch()


def launch_smem(smem: int, target_smem_per_sm: int) -> int:
    """The dynamic shared memory a launch built now asks for: padded_smem for this process's arch when requested."""
    arch = arch_here() if requested() else None
    return smem if arch is None else padded_smem(smem, target_smem_per_sm, arch)


def padding(launch, target_smem_per_sm: int):
    """`launch` (KernelLauncher.launch) asking for launch_smem instead of the kernel's own dynamic shared memory."""

    @functools.wraps(launch)
    def launch_at_target_occupancy(self, *args, **kwargs):
        smem = kwargs.get("smem")
        if isinstance(smem, int) and not isinstance(smem, bool):
            kwargs["smem"] = launch_smem(smem, target_smem_per_sm)
        return launch(self, *args, **kwargs)

    launch_at_target_occupancy.pads_to_target = True
    return launch_at_target_occupancy


def install(target_smem_per_sm: int) -> None:
    """Every DSL kernel launch built in this process from now on asks for launch_smem (decided at each build, so
    the setting and the arch of that moment count). A second call changes nothing: one padding, never two."""
    from cutlass.cutlass_dsl.cutlass import KernelLauncher

    if not getattr(KernelLauncher.launch, "pads_to_target", False):
        KernelLauncher.launch = padding(KernelLauncher.launch, target_smem_per_sm)
