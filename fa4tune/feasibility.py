"""Static feasibility: is a config possible for a target and problem class, and if not, which rule fails.

Pure functions, no GPU, no compiler. A forward config's rules come from its kernel class (fa4tune.kernel_class):
the knobs it declares, its limits, its shared-memory formula against the target's capacity, then its own
`can_implement`; the backward's are upstream's `can_implement` (SM120 shared-memory formula included) plus the
ones upstream does not check but the kernel needs. Each rejection names its rule and the numbers.
`upstream_can_implement_*` call upstream's own functions, so tests can show that both agree wherever upstream
has a rule.
"""

from __future__ import annotations

from fa4tune.config import FP8, BackwardConfig, ForwardConfig, Problem, ProblemClass
from fa4tune.kernel_class import (backward_kernel, backward_kernels, class_features, forward_kernel, forward_kernels,
                                  runs_features, runs_varlen)
from fa4tune.targets import Target
from fa4tune.verdict import OK, Verdict  # noqa: F401  (named here: a rule's answer, ok or failing)

BYTES_PER_ELEMENT = 2  # fp16 / bf16




def _fail(rule: str, message: str) -> Verdict:
    return Verdict(False, rule, message)


def forward_smem_bytes(cfg: ForwardConfig, pc: ProblemClass) -> tuple[int, str]:
    """Shared memory the config's forward kernel needs and a breakdown (its kernel class's formula)."""
    return forward_kernel(cfg.kernel).smem_bytes(cfg, pc)


def backward_smem_bytes(cfg: BackwardConfig, pc: ProblemClass) -> tuple[int, str]:
    """Shared memory the config's backward kernel needs and a breakdown (its kernel class's formula)."""
    return backward_kernel(cfg.kernel).smem_bytes(cfg, pc)


def _positive_multiple(name: str, value: int, multiple: int, upper: int) -> Verdict:
    if value <= 0 or value % multiple or value > upper:
        return _fail(f"{name}_domain", f"{name} must be a multiple of {multiple} in [{multiple}, {upper}], got {value}")
    return OK


def _sizes(cfg, m_name: str, n_name: str) -> Verdict:
    """Both tile sizes positive multiples of 16 (at most 256), num_threads of 32 (at most 512); upstream's own
    rule names where it has the rule (tile_n / n_block_size multiple of 16, num_threads multiple of 32)."""
    for name, multiple, upper in ((m_name, 16, 256), (n_name, 16, 256), ("num_threads", 32, 512)):
        value = getattr(cfg, name)
        verdict = _positive_multiple(name, value, multiple, upper)
        if not verdict:
            if name == n_name and value % 16:
                return _fail(f"{n_name}_multiple_of_16", f"{n_name} must be a multiple of 16, got {value}")
            if name == "num_threads" and value % 32:
                return _fail("num_threads_multiple_of_32", f"num_threads must be a multiple of 32 (a warp), got {value}")
            return verdict
    return OK


def check_forward(cfg: ForwardConfig, pc: ProblemClass, target: Target, kernels: dict[str, type] | None = None) -> Verdict:
    """All static rules for a forward config, in the order a reader would check them; `kernels`: the registry
    (fa4tune.kernel_class.forward_kernels() when None)."""
    kernels = forward_kernels() if kernels is None else kernels
    cls = kernels.get(cfg.kernel)
    if cls is None:
        return _fail("kernel_known", f"kernel {cfg.kernel!r} is not one of {', '.join(kernels)} (the kernel classes of kernels/ and experiment.py)")
    if not (verdict := _kernel_knobs(cfg, cls)):
        return verdict
    if not (verdict := _fp8_opt_in(cfg, pc, cls)):
        return verdict
    if not (verdict := _features(cfg, pc, cls)):
        return verdict
    if not (verdict := _sizes(cfg, "tile_m", "tile_n")):
        return verdict
    if not (verdict := _limits(cfg, pc, cls)):  # before the shared-memory formula, which needs a stage count
        return verdict
    smem, breakdown = cls.smem_bytes(cfg, pc)
    if smem > target.smem_per_block:
        return _fail(
            "smem_capacity",
            f"needs {smem} B of shared memory ({breakdown}), {target.name} has {target.smem_per_block} B per block",
        )
    return cls.can_implement(cfg, pc, target)


def check_forward_problem(cfg: ForwardConfig, problem: Problem, target: Target, kernels: dict[str, type] | None = None) -> Verdict:
    """check_forward for the problem's class, then the kernel class's sequence-length limits and its own rules for
    this problem (can_implement_problem)."""
    kernels = forward_kernels() if kernels is None else kernels
    verdict = check_forward(cfg, problem.problem_class, target, kernels)
    return verdict and _problem_rules(cfg, problem, target, kernels)


def _problem_rules(cfg: ForwardConfig, problem: Problem, target: Target, kernels: dict[str, type]) -> Verdict:
    """A packed problem's rule (its class runs packed batches), the kernel class's sequence-length limits, then its own
    rules for the problem (a config check_forward passed)."""
    if problem.lengths and not runs_varlen(kernels[cfg.kernel]):
        return _fail("varlen_kernel", f"kernel {cfg.kernel!r} does not run packed batches (only a class that declares "
                                      "varlen = True does)")
    limits = kernels[cfg.kernel].limits
    for name, value in (("seqlen_q", problem.seqlen_q), ("seqlen_k", problem.seqlen_k)):
        low, high = getattr(limits, name)
        if value < low or (high is not None and value > high):
            return _fail(f"{name}_domain", f"kernel {cfg.kernel!r} runs {name} in [{low}, {high if high is not None else 'any'}], got {value}")
    return kernels[cfg.kernel].can_implement_problem(cfg, problem, target)


def check_forward_entry(cfg: ForwardConfig, pc: ProblemClass, target: Target, kernels: dict[str, type] | None = None) -> Verdict:
    """check_forward, then the class's rules for the problem class's shortest problem (ProblemClass.shortest_problem):
    what a dispatch entry must pass, since it runs every problem of its class (a fixed num_splits above 1 does not
    run a 1-key decode). The search proposes only such configs; the bench scripts may time the others."""
    kernels = forward_kernels() if kernels is None else kernels
    verdict = check_forward(cfg, pc, target, kernels)
    return verdict and _problem_rules(cfg, pc.shortest_problem(), target, kernels)


def _fp8_opt_in(cfg: ForwardConfig, pc: ProblemClass, cls: type) -> Verdict:
    """FP8 is opt-in: an "fp8" class runs a kernel class that quantizes (`quantizes`), and only such a class runs it."""
    if pc.dtype == FP8 and not cls.quantizes:
        return _fail("fp8_kernel", f"the fp8 class {pc.name} needs a kernel class that quantizes (sm120_fp8), got {cfg.kernel!r}")
    if pc.dtype != FP8 and cls.quantizes:
        return _fail("fp8_opt_in", f"{cfg.kernel} computes S in e4m3: it never serves the {pc.dtype} class {pc.name} "
                                   "(FP8 is opt-in: an fp8 problem class, or fa4tune.fp8.attention_fp8)")
    return OK


def _features(cfg: ForwardConfig | BackwardConfig, pc: ProblemClass, cls: type) -> Verdict:
    """A window or softcap class runs only a kernel class whose own code declares that feature (`features`)."""
    missing = sorted(class_features(pc) - runs_features(cls))
    if missing:
        return _fail(f"kernel_{missing[0]}", f"kernel {cfg.kernel!r} does not run {missing[0]} ({pc.name}; only a class "
                                             f"that declares {missing[0]!r} in its features does)")
    return OK


def _kernel_knobs(cfg: ForwardConfig | BackwardConfig, cls: type) -> Verdict:
    """The config carries exactly its kernel class's own knobs, and those of its call knobs the call set, each with a
    value of the class's domain."""
    given, declared, call = cfg.extra_knobs, dict(cls.knobs), dict(getattr(cls, "call_knobs", {}))
    unknown = sorted(set(given) - set(declared) - set(call))
    missing = [name for name in declared if name not in given]
    if unknown or missing:
        what = f"has no knob {unknown[0]!r}" if unknown else f"needs knob {missing[0]!r}"
        return _fail("kernel_knobs", f"kernel {cfg.kernel!r} {what} (its own knobs: {', '.join([*declared, *call]) or 'none'})")
    for name, domain in {**declared, **{name: call[name] for name in call if name in given}}.items():
        value = given[name]
        if not any(value == d and type(value) is type(d) for d in domain):
            return _fail("kernel_knobs", f"kernel {cfg.kernel!r} needs {name} in {', '.join(map(repr, domain))}, got {value!r}")
    return OK


def _limits(cfg: ForwardConfig | BackwardConfig, pc: ProblemClass, cls: type) -> Verdict:
    """The kernel class's declared limits (fa4tune.kernel_class.Limits) for this config and problem class (a backward
    config's num_stages_Q and num_stages_dO against `num_stages`)."""
    limits, kernel = cls.limits, repr(cfg.kernel)
    stages = ("num_stages",) if isinstance(cfg, ForwardConfig) else ("num_stages_Q", "num_stages_dO")
    for name in stages:
        value = getattr(cfg, name)
        if isinstance(value, bool) or value not in limits.num_stages:
            return _fail("num_stages_domain", f"kernel {kernel} runs {name} in {', '.join(map(str, limits.num_stages))}, got {value!r}")
    if limits.num_threads is not None and cfg.num_threads not in limits.num_threads:
        return _fail("num_threads_domain", f"kernel {kernel} runs num_threads in {', '.join(map(str, limits.num_threads))}, got {cfg.num_threads}")
    low, high = limits.head_dim
    for name in ("head_dim", "head_dim_v"):
        if not low <= getattr(pc, name) <= high:
            return _fail("head_dim_domain", f"kernel {kernel} runs {name} in [{low}, {high}], got {getattr(pc, name)}")
    if pc.causal and not limits.causal:
        return _fail("causal_supported", f"kernel {kernel} does not run causal problems (its limits: causal=False)")
    if pc.qhead_per_kvhead > 1 and not limits.gqa:
        return _fail("gqa_supported", f"kernel {kernel} does not run GQA (qhead_per_kvhead={pc.qhead_per_kvhead}; its limits: gqa=False)")
    return OK


# Rules whose configs compile but compute a wrong result (found by gating them on the GPU, see
# docs/measurements/2026-12-01-h200-bwd-sweep.md); `check_backward(..., skip=GATE_RULES)` lets the census and the sweep measure them.
GATE_RULES: frozenset[str] = frozenset({"SdP_swapAB_lse_columns", "dKV_swapAB_transposed",
                                        "causal_bwd_SdP_warps_along_m", "V_in_regs_wrong_gradients",
                                        "m_block_32_head_dim_96"})


def padded_head_dim(head_dim: int) -> int:
    """Upstream's backward pads head dims to a multiple of 32 (flash_bwd.py, hdim_multiple_of)."""
    return -(-head_dim // 32) * 32


def _mma_tile(rule: str, gemm: str, rows: tuple[str, int], cols: tuple[str, int], atoms: tuple[str, int], warps: int) -> Verdict:
    """A tiled MMA of `atoms` warps down the rows and warps/atoms across, each warp 16x16, must tile the gemm's
    rows x cols (upstream's _get_tiled_mma: permutation (atoms*16, warps/atoms*16, 16)). With the swap the
    atom layout and the gemm are both transposed, so the condition is the same."""
    (row_name, row), (col_name, col), (atom_name, atom) = rows, cols, atoms
    tile_rows, tile_cols = atom * 16, warps // atom * 16
    if row % tile_rows or col % tile_cols:
        return _fail(rule, f"the {gemm} MMA ({atom_name}={atom} of {warps} warps: a {tile_rows}x{tile_cols} tile) must tile "
                           f"{row_name} x {col_name} = {row}x{col}")
    return OK


def check_backward(cfg: BackwardConfig, pc: ProblemClass, target: Target, skip: frozenset[str] = frozenset(),
                   kernels: dict[str, type] | None = None) -> Verdict:
    """All static rules for a backward config: its kernel class known, its own knobs, upstream's can_implement, then
    the ones upstream's kernel needs but does not check (each named, each found by compiling or gating,
    docs/measurements/2026-12-01-h200-bwd-sweep.md; every class built on upstream's code inherits them), then the
    class's limits, shared memory and can_implement. `skip`: rule names not applied (the census and the sweep measure
    GATE_RULES' configs); `kernels`: the registry (fa4tune.kernel_class.backward_kernels() when None)."""
    kernels = backward_kernels() if kernels is None else kernels
    if pc.dtype == FP8:
        return _fail("fp8_forward_only", f"the FP8 path has no backward ({pc.name}): train in bf16 or fp16")
    cls = kernels.get(cfg.kernel)
    if cls is None:
        return _fail("kernel_known", f"backward kernel {cfg.kernel!r} is not one of {', '.join(kernels)} (the kernel "
                                     "classes of kernels/ and experiment.py)")
    if not (verdict := _kernel_knobs(cfg, cls)):
        return verdict
    if not (verdict := _features(cfg, pc, cls)):
        return verdict
    if not (verdict := _sizes(cfg, "m_block_size", "n_block_size")):
        return verdict
    for name in ("num_stages_Q", "num_stages_dO"):
        if getattr(cfg, name) not in (1, 2):
            return _fail(f"{name}_domain", f"{name} must be 1 or 2, got {getattr(cfg, name)}")
    if not (verdict := _limits(cfg, pc, cls)):
        return verdict
    smem, breakdown = cls.smem_bytes(cfg, pc)
    if smem > target.smem_per_block:
        return _fail(
            "smem_capacity",
            f"needs {smem} B of shared memory ({breakdown}), {target.name} has {target.smem_per_block} B per block",
        )
    if cfg.num_stages_Q < cfg.num_stages_dO:
        return _fail("num_stages_Q_ge_dO", f"num_stages_Q ({cfg.num_stages_Q}) must be >= num_stages_dO ({cfg.num_stages_dO})")
    if pc.causal and cfg.m_block_size != cfg.n_block_size:
        # Measured: causal backward with 128x64 or 64x128 blocks gives wrong dQ/dK/dV (relative error > 1.5,
        # d64 and d128, GQA too; docs/measurements/2026-11-29-h200-smoke.md); non-causal is correct.
        return _fail(
            "causal_bwd_square_blocks",
            f"causal backward needs m_block_size == n_block_size, got {cfg.m_block_size}x{cfg.n_block_size}",
        )
    if unknown := cls.fixes - GATE_RULES:
        return _fail("fixes_known", f"kernel {cfg.kernel!r} declares fixes {sorted(unknown)}, not among the gate-measured rules "
                                    f"{sorted(GATE_RULES)}")
    warps = cfg.num_threads // 32
    for name in ("AtomLayoutMSdP", "AtomLayoutNdKV", "AtomLayoutMdQ"):
        value = getattr(cfg, name)
        if value <= 0 or warps % value:
            return _fail(f"{name}_divides_warps", f"{name}={value} must divide the {warps} MMA warps of num_threads={cfg.num_threads}")
    for verdict in _backward_mma_rules(cfg, pc, warps):
        if not verdict and verdict.rule not in skip and verdict.rule not in cls.fixes:
            return verdict
    return cls.can_implement(cfg, pc, target)


def _backward_mma_rules(cfg: BackwardConfig, pc: ProblemClass, warps: int):
    """The rules measured on the gate, then the three tiled MMAs of upstream's Sm80 backward (flash_bwd.py) against
    the blocks they compute; a generator of verdicts (the first failing one not skipped is the answer)."""
    m, n, hd, hdv = cfg.m_block_size, cfg.n_block_size, padded_head_dim(pc.head_dim), padded_head_dim(pc.head_dim_v)
    a_sdp, a_dkv, a_dq = cfg.AtomLayoutMSdP, cfg.AtomLayoutNdKV, cfg.AtomLayoutMdQ
    # Measured on the H200 sweep (docs/measurements/2026-12-01-h200-bwd-sweep.md): every causal config whose S/dP
    # MMA puts warps along n failed the gate on dQ (187 of 187), every one with all warps along m passed (46 of 46)
    if pc.causal and a_sdp != warps:
        yield _fail("causal_bwd_SdP_warps_along_m",
                    f"causal backward needs every warp of the S/dP MMA along m (AtomLayoutMSdP == num_threads/32 = {warps}), "
                    f"got AtomLayoutMSdP={a_sdp}: with warps along n dQ fails the gate")
    # Measured: every V_in_regs=True config that compiled failed the gate (303 of 303, causal and not)
    if cfg.V_in_regs:
        yield _fail("V_in_regs_wrong_gradients", "V_in_regs=True: upstream's Sm80 backward computes wrong gradients with it "
                                                 "(303 of 303 configs failed the gate on the H200); its struct keeps sV, so it saves no shared memory either")
    # Measured: with head_dim 96 every m_block_size=32 config failed the gate on dQ (27 of 27, max error ~900),
    # m_block_size 64 and 128 passed (58 of 58); head_dim 64 and 128 pass at 32
    if m == 32 and hd % 64:
        yield _fail("m_block_32_head_dim_96", f"m_block_size=32 with head_dim {pc.head_dim} (padded {hd}, not a multiple of 64): "
                                              "dQ fails the gate (27 of 27 measured)")
    # Compiled for sm_120a (search/data/bwd_census.jsonl): with head_dim 96 every dQ_swapAB config whose dQ MMA had 4
    # warps along m failed to compile (14 of 14, 128 and 256 threads: "Expected source and destination tensors to
    # have the same size in mode-1, but got 6 and 8"), every one with 2 compiled (12 of 12); head_dim 64 and 128 compile
    if cfg.dQ_swapAB and hd % 64 and a_dq >= 4:
        yield _fail("dQ_swapAB_head_dim_96_atoms",
                    f"dQ_swapAB with head_dim {pc.head_dim} (padded {hd}, not a multiple of 64) needs AtomLayoutMdQ <= 2, "
                    f"got {a_dq}: the swapped dQ does not compile (14 of 14 in the census)")
    # S = Q K^T and dP = dO V^T: an m x n block
    yield _mma_tile("SdP_mma_tile", "S/dP", ("m_block_size", m), ("n_block_size", n), ("AtomLayoutMSdP", a_sdp), warps)
    if cfg.SdP_swapAB:
        # P and dS are stored to shared memory (m x n) through the swapped MMA's own C layout (n x m)
        yield _mma_tile("SdP_swapAB_P_store", "S/dP (swapped, P store)", ("m_block_size", m), ("n_block_size", n),
                        ("num_threads/32/AtomLayoutMSdP", warps // a_sdp), warps)
        # exp(S - LSE) subtracts LSE[r] from row r of the accumulator; swapped, rows are n and LSE runs along m:
        # the kernel asserts rows per thread (n/(8*warps/AtomLayoutMSdP)) == LSE values per thread (m/(4*AtomLayoutMSdP))
        if n * a_sdp * a_sdp != 2 * warps * m:
            yield _fail("SdP_swapAB_lse_rows",
                        f"SdP_swapAB needs n_block_size*AtomLayoutMSdP^2 == 2*warps*m_block_size (the LSE per row), got "
                        f"{n}*{a_sdp}^2 = {n * a_sdp * a_sdp} vs 2*{warps}*{m} = {2 * warps * m}")
        yield _fail("SdP_swapAB_lse_columns", "SdP_swapAB subtracts the LSE of column r from row r of S^T (flash_bwd.py, "
                                              "acc_S_mn[r] - tLSErLSE[r]): where it compiles, dS comes out wrong")
    # dV = P^T dO (n x hdv) and dK = dS^T Q (n x hd)
    yield _mma_tile("dKV_mma_tile", "dK/dV", ("n_block_size", n), ("head_dim (padded to 32)", min(hd, hdv)),
                    ("AtomLayoutNdKV", a_dkv), warps)
    yield _mma_tile("dKV_mma_tile", "dK/dV", ("n_block_size", n), ("head_dim (padded to 32)", max(hd, hdv)),
                    ("AtomLayoutNdKV", a_dkv), warps)
    if cfg.dKV_swapAB:
        # the dK/dV accumulators are sized (n_block_size, head_dim) without the swap (flash_bwd.py, acc_shape_dK):
        # the swapped gemm's head_dim x n_block_size result only fits when both are equal
        if not n == hd == hdv:
            yield _fail("dKV_swapAB_accumulator",
                        f"dKV_swapAB: upstream sizes the dK/dV accumulators n_block_size x head_dim = {n}x{hd} without the swap, "
                        f"so the swapped gemm ({hd}x{n}) fits only when n_block_size == head_dim (padded to 32)")
        yield _fail("dKV_swapAB_transposed", "dKV_swapAB: the swapped gemm's head_dim x n_block_size result is stored as "
                                             "n_block_size x head_dim (flash_bwd.py epilogue): dK and dV come out transposed")
    # dQ = dS K: an m x hd block
    yield _mma_tile("dQ_mma_tile", "dQ", ("m_block_size", m), ("head_dim (padded to 32)", hd), ("AtomLayoutMdQ", a_dq), warps)


PREPROCESS_THREADS = (64, 128, 256, 512)  # the backward preprocess's thread counts measured (upstream's default: 256)


def check_preprocess_threads(threads: int, cfg: BackwardConfig, pc: ProblemClass) -> Verdict:
    """The backward preprocess's thread count against its kernel's own conditions
    (FlashAttentionBackwardPreprocess.can_implement and the dQaccum copy's assertion in _setup_attributes)."""
    rows = cfg.m_block_size * padded_head_dim(pc.head_dim) // 4  # 128-bit (4 x fp32) dQaccum copies per m block
    if threads not in PREPROCESS_THREADS:
        return _fail("preprocess_threads_domain", f"preprocess threads must be one of {PREPROCESS_THREADS}, got {threads}")
    if threads < cfg.m_block_size:
        return _fail("preprocess_threads_rows", f"preprocess threads ({threads}) must be >= m_block_size ({cfg.m_block_size}): "
                                                "one thread scales each row's LSE")
    if rows % threads:
        return _fail("preprocess_threads_dQaccum", f"preprocess threads ({threads}) must divide m_block_size x head_dim "
                                                   f"(padded) / 4 = {rows}, the dQaccum copies of an m block")
    # Measured (docs/measurements/2026-12-01-h200-preprocess-threads.md): 512 threads at head_dim 96 gave wrong
    # gradients on the d96 non-causal problem (max error 2,829x the largest gradient); 64-256 matched 256 everywhere
    if threads > 256 and padded_head_dim(pc.head_dim) % 64:
        return _fail("preprocess_threads_head_dim_96", f"preprocess threads {threads} with head_dim {pc.head_dim}: the "
                                                       "gradients came out wrong (measured); at most 256")
    return OK


def upstream_can_implement_forward(cfg: ForwardConfig, pc: ProblemClass, is_causal: bool | None = None) -> bool:
    """Upstream's FlashAttentionForwardSm120.can_implement for the same numbers (tests compare)."""
    import cutlass
    from flash_attn.cute.flash_fwd_sm120 import FlashAttentionForwardSm120

    dtype = cutlass.BFloat16 if pc.dtype == "bf16" else cutlass.Float16
    return FlashAttentionForwardSm120.can_implement(
        dtype, pc.head_dim, pc.head_dim_v, cfg.tile_m, cfg.tile_n, cfg.num_stages, cfg.num_threads,
        pc.causal if is_causal is None else is_causal, Q_in_regs=cfg.Q_in_regs,
    )


def upstream_can_implement_backward(cfg: BackwardConfig, pc: ProblemClass) -> bool:
    """Upstream's FlashAttentionBackwardSm120.can_implement for the same numbers (tests compare)."""
    import cutlass
    from flash_attn.cute.flash_bwd_sm120 import FlashAttentionBackwardSm120

    dtype = cutlass.BFloat16 if pc.dtype == "bf16" else cutlass.Float16
    return FlashAttentionBackwardSm120.can_implement(
        dtype, pc.head_dim, pc.head_dim_v, cfg.m_block_size, cfg.n_block_size, cfg.num_stages_Q,
        cfg.num_stages_dO, cfg.num_threads, pc.causal, V_in_regs=cfg.V_in_regs,
    )
