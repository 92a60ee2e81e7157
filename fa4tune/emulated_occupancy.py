"""SM120's CTAs per SM, reproduced on a GPU with more shared memory per SM (opt-in, for emulation; NOT yet run on a GPU).

An SM120 SM has 100 KB of shared memory (fa4tune.targets: `smem_per_sm`), an H200's 228 KB. Under emulation a CTA
of 51-66 KB runs 2-3 times per H200 SM (the registers allowing) but once per SM120 SM, so the H200 ranks configs by
an occupancy SM120 cannot give them (docs/measurements/2026-12-01-occupancy-gap.md). With
`FA4TUNE_EMULATE_OCCUPANCY=1` in the environment of the processes that build kernels, every DSL kernel launch asks for
more dynamic shared memory than it uses: as much as makes the GPU fit exactly the target's number of CTAs by shared
memory. The kernel's code and its shared storage are unchanged (the rules read the traced storage, not the launch),
and the registers then limit both GPUs alike (the same 64K register file). The padded size is part of the compiled
host code, so the variable is in the kernel cache's fingerprint.

A preferred shared-memory carveout (CUDA's hint) was tried first and had no measurable effect on the H200.
"""

from __future__ import annotations

import functools
import os

OCCUPANCY_ENV = "FA4TUNE_EMULATE_OCCUPANCY"
RESERVED_PER_CTA = 1024  # shared memory the driver keeps per CTA (both arches)
STATIC_SMEM = 1024  # the SM120 kernels' static shared memory (their cubins: 1 KB); the launch does not know it

# Per SM / per CTA shared memory by the arch kernels are compiled for (CUDA C++ Programming Guide), bytes.
SMEM_PER_SM = {"sm_80": 167936, "sm_87": 167936, "sm_90": 233472, "sm_90a": 233472, "sm_100": 233472, "sm_100a": 233472}
SMEM_PER_CTA = {"sm_80": 166912, "sm_87": 166912, "sm_90": 232448, "sm_90a": 232448, "sm_100": 232448, "sm_100a": 232448}


def padded_smem(smem: int, target_smem_per_sm: int, arch: str) -> int:
    """The dynamic shared memory to launch a kernel that uses `smem` with, so that `arch` holds as many CTAs by
    shared memory as the target does; `smem` itself where `arch` has no more than the target (or is unknown)."""
    device = SMEM_PER_SM.get(arch)
    if device is None or device <= target_smem_per_sm:
        return smem
    per_cta = smem + STATIC_SMEM + RESERVED_PER_CTA
    on_target = max(1, target_smem_per_sm // per_cta)
    if device // per_cta <= on_target:
        return smem
    return max(smem, min(device // on_target, SMEM_PER_CTA[arch] + RESERVED_PER_CTA) - RESERVED_PER_CTA - STATIC_SMEM)


def requested() -> bool:
    """Whether this process's environment asks for the target's occupancy."""
    return os.environ.get(OCCUPANCY_ENV, "") not in ("", "0")


@functools.cache
def apply(target_smem_per_sm: int, arch: str) -> bool:
    """From now on every DSL kernel launch built in this process asks for padded_smem; once per process. False where
    `arch` has no more shared memory per SM than the target."""
    if SMEM_PER_SM.get(arch, 0) <= target_smem_per_sm:
        return False
    from cutlass.cutlass_dsl.cutlass import KernelLauncher

    launch = KernelLauncher.launch

    @functools.wraps(launch)
    def launch_at_target_occupancy(self, *args, **kwargs):
        smem = kwargs.get("smem")
        if isinstance(smem, int) and not isinstance(smem, bool):
            kwargs["smem"] = padded_smem(smem, target_smem_per_sm, arch)
        return launch(self, *args, **kwargs)

    KernelLauncher.launch = launch_at_target_occupancy
    return True
