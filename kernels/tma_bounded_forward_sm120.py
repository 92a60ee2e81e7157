"""The TMA-fed SM120 forward with a launch bound (kernel "sm120_tma_bounded"): TmaForwardSm120's code, compiled for at
least `min_blocks_per_mp` CTAs per SM.

Registers are what hold most forward configs at 8 warps per SM120 SM (docs/measurements/2026-12-02-gqa-chunked-static-space.md:
the chunked GQA entry, 64x64 tiles with Q in registers, has 214 registers; 3 CTAs of 128 threads need at most 170).
`min_blocks_per_mp` is the DSL's launch parameter of that name (`.minnctapersm`, CUDA's `__launch_bounds__`
second argument): ptxas then fits the kernel into 65,536 / (min_blocks_per_mp x num_threads) registers a thread,
spilling what does not fit (the static check reads the spills). The bound only pays where shared memory lets that
many CTAs in, so the class refuses a bound its shared memory cannot meet (rule `min_blocks_per_mp_fits_smem`).
"""

from fa4tune.feasibility import OK, Verdict
from kernels.tma_forward_sm120 import TmaForwardSm120

MIN_BLOCKS_DOMAIN = (2, 3, 4)
MIN_REGISTERS_PER_THREAD = 64  # below it a flash-attention forward spills its accumulators (rule min_blocks_per_mp_registers)
CARVEOUT_MAX_SHARED = 100  # CUDA's preferred shared-memory carveout, in percent: all of the unified L1 as shared memory


class TmaBoundedForwardSm120(TmaForwardSm120):
    """TmaForwardSm120 compiled for `min_blocks_per_mp` CTAs per SM (the registers cap that gives)."""

    name = "sm120_tma_bounded"
    knobs = {"min_blocks_per_mp": MIN_BLOCKS_DOMAIN}
    # slower than sm120_tma on every chunked problem it was timed on, bound or not
    # (docs/measurements/2026-12-03-h200-tma-bounded.md): the search spends no evaluations on it
    searched = False

    def __init__(self, *args, min_blocks_per_mp: int = MIN_BLOCKS_DOMAIN[0], **kwargs):
        super().__init__(*args, **kwargs)
        self.min_blocks_per_mp = min_blocks_per_mp

    def launch_bounds(self) -> dict:
        # the carveout is passed so that the DSL does not ask a device for its shared memory per SM (none on a CPU)
        return {"min_blocks_per_mp": self.min_blocks_per_mp, "preferred_smem_carveout": CARVEOUT_MAX_SHARED}

    @classmethod
    def can_implement(cls, config, problem_class, target) -> Verdict:
        """TmaForwardSm120's rules, then: the bound's CTAs fit the SM's threads and shared memory, and leave each
        thread at least MIN_REGISTERS_PER_THREAD registers."""
        verdict = super().can_implement(config, problem_class, target)
        if not verdict:
            return verdict
        blocks = config.extra_knobs["min_blocks_per_mp"]
        threads = blocks * config.num_threads
        if threads > target.max_threads_per_sm:
            return Verdict(False, "min_blocks_per_mp_threads",
                           f"min_blocks_per_mp={blocks} CTAs of {config.num_threads} threads are {threads} threads, "
                           f"{target.name} holds {target.max_threads_per_sm} per SM")
        smem, _ = cls.smem_bytes(config, problem_class)
        per_cta = smem + target.smem_reserved_per_block
        if blocks * per_cta > target.smem_per_sm:
            return Verdict(False, "min_blocks_per_mp_fits_smem",
                           f"min_blocks_per_mp={blocks} CTAs of {smem} B of shared memory (+{target.smem_reserved_per_block} B "
                           f"reserved each) need {blocks * per_cta} B, {target.name} has {target.smem_per_sm} B per SM")
        budget = target.registers_per_sm // threads
        if budget < MIN_REGISTERS_PER_THREAD:
            return Verdict(False, "min_blocks_per_mp_registers",
                           f"min_blocks_per_mp={blocks} CTAs of {config.num_threads} threads leave {budget} registers a "
                           f"thread, fewer than {MIN_REGISTERS_PER_THREAD}")
        return OK
