"""The peers' configs in our terms, without a GPU: #2771's SM120 backward configs as our BackwardConfig (or what our
classes cannot express of them), and the candidate lists handed to upstream's autotuner (flash_attn.cute.autotune).

#2771 (Dao-AILab/flash-attention pull request 2771, commit 41f27f3f, flash_attn/cute/interface.py l.1891-1975 and
l.2167-2181, read from .peers/pr2771/): 256 threads; 64x64 blocks, 64x128 at head dims <= 64 when the 128-key grid
fills two waves; one Q and one dO stage, two Q stages for sequences of 8192 and more (d <= 128); at d64 with 64x128
and 8192+ queries P and dS stay in registers (SdP_swapAB, AtomLayoutMSdP 1, AtomLayoutNdKV 8: Mma_dKV_is_RS);
AtomLayoutNdKV 2 at d128; at d128 MHA square 8192+ V in registers and AtomLayoutMdQ 2, causal ones skipping the mask
on the blocks below the diagonal. `pr2771_backward` transcribes that rule (our code, their numbers), and
`express_pr2771` runs it past our static rules on our backward classes: a row either times the same knobs in our
class, naming the kernel code of theirs it lacks, or says "cannot express" with the rule our class fails.

upstream's autotuner (flash-attn-4 4.0.0b40) tunes FwdConfig records for one call; on SM120 a FwdConfig chooses the
tile (tile_m, tile_n) and pack_gqa (the interface passes 128 threads, one stage, no Q in registers, one split). It
ships no candidate list. `autotune_own`: the SM120 tiles upstream's own selector knows (`select_initial_fwd_tile`:
128x128, 128x64) with pack_gqa both ways for GQA, those our static rules admit (99 KB); `autotune_handover`: our
feasible space (fa4tune.space.feasible_forward) in its format: the configs of upstream's class at 128 threads, one
stage, no Q in registers, with the selector's pack_gqa; the rest counted by what FwdConfig cannot say.
"""

from __future__ import annotations

import dataclasses

from fa4tune.config import BackwardConfig, ForwardConfig, Problem, is_local
from fa4tune.feasibility import check_backward, check_forward
from fa4tune.targets import Target

SM120_ARCH = 120
TORCH_DTYPE_NAMES = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}  # str(torch dtype), as upstream's inputs hold it

# ---- #2771's backward ----

PR2771_THREADS = 256
PR2771_LONG = 8192  # sequence length from which its long-sequence settings apply
# kernel code of #2771 that our classes (b40's SM80 backward) do not have, for every config it runs
PR2771_ALWAYS = ("fp32x4 vector atomics for the dQ/dK/dV accumulators (flash_bwd.py l.1131-1150, l.1298-1330)",)
# our static rules a #2771 config can fail, and the feature of theirs behind it
PR2771_FEATURES = {
    "SdP_swapAB_lse_columns": "register-resident P/dS (SdP_swapAB, AtomLayoutMSdP 1, AtomLayoutNdKV 8: Mma_dKV_is_RS; "
                              "theirs stores P/dS transposed and still stages dS for dQ, flash_bwd.py l.217-233, l.1094-1101)",
    "SdP_swapAB_lse_rows": "register-resident P/dS (SdP_swapAB with AtomLayoutMSdP 1)",
    "SdP_swapAB_P_store": "register-resident P/dS (SdP_swapAB with AtomLayoutMSdP 1; theirs stores P/dS transposed, "
                          "flash_bwd.py l.217-233)",
    "V_in_regs_wrong_gradients": "V in registers (V_in_regs; theirs feeds the dP gemm its register fragment, flash_bwd.py "
                                 "l.1058)",
    "causal_bwd_square_blocks": "64x128 causal blocks (their mask's r2p_compatible path, mask.py l.165-176, flash_bwd.py "
                                "l.879-896)",
    "causal_bwd_SdP_warps_along_m": "a causal mask with S/dP warps along n (their mask's r2p_compatible path, mask.py "
                                    "l.165-176, flash_bwd.py l.879-896)",
}
PR2771_CLASSES = ("sm120", "sm120_cmask")  # upstream's class, then ours that fixes the causal mask with warps along n


@dataclasses.dataclass(frozen=True)
class Pr2771Config:
    """#2771's backward for one problem: its knobs as ours, and the flags of its own kernel arguments."""

    config: BackwardConfig
    skip_full_causal_mask: bool  # its kernel argument: the blocks below the diagonal traced without a mask
    postprocess_dQ_threads: int  # its dQ postprocess: 256 with AtomLayoutMdQ 2, else 128


def pr2771_backward(p: Problem, num_sms: int) -> Pr2771Config:
    """#2771's SM120 backward for a problem, on a GPU whose selection sees `num_sms` SMs (its
    get_num_sms_for_selection: FLASH_ATTENTION_NUM_SMS where set)."""
    local = is_local(p.causal, p.window_size_left, p.window_size_right)
    packed = bool(p.lengths)
    n_block = 64
    if p.head_dim <= 64 and p.head_dim_v <= 64 and not local and not packed:
        if -(-p.seqlen_k // 128) * p.num_heads * p.batch >= 2 * num_sms:  # two waves of 128-key blocks
            n_block = 128
    registers_pds = n_block == 128 and p.seqlen_q >= PR2771_LONG
    stages_q = 2 if (p.head_dim <= 128 and p.head_dim_v <= 128 and not packed and p.seqlen_q >= PR2771_LONG
                     and not registers_pds) else 1
    knobs = dict(m_block_size=64, n_block_size=n_block, num_stages_Q=stages_q, num_stages_dO=1, num_threads=PR2771_THREADS,
                 SdP_swapAB=False, dKV_swapAB=False, dQ_swapAB=False, AtomLayoutMSdP=4, AtomLayoutNdKV=4, AtomLayoutMdQ=4,
                 V_in_regs=False)
    if registers_pds:
        knobs.update(SdP_swapAB=True, AtomLayoutMSdP=1, AtomLayoutNdKV=PR2771_THREADS // 32)
    if p.head_dim == 128 and p.head_dim_v == 128:
        knobs.update(AtomLayoutNdKV=2)
    d128_long = (p.head_dim == 128 and p.head_dim_v == 128 and not local and not packed and p.seqlen_q == p.seqlen_k
                 and p.seqlen_q >= PR2771_LONG and p.num_heads == p.num_heads_kv)
    if d128_long:
        knobs.update(AtomLayoutMdQ=2, V_in_regs=True)
    skip = (d128_long and p.causal and p.seqlen_q % 64 == 0 and p.seqlen_k % n_block == 0 and not p.softcap)
    return Pr2771Config(BackwardConfig(**knobs), skip, PR2771_THREADS if knobs["AtomLayoutMdQ"] == 2 else 128)


@dataclasses.dataclass(frozen=True)
class Expressed:
    """A #2771 config through our classes: `config` (None: cannot express, `cannot` says what and why), and the kernel
    code of theirs the timed config runs without (`without`)."""

    config: BackwardConfig | None
    cannot: str = ""
    without: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        if self.config is None:
            return f"cannot express: {self.cannot}"
        return f"{self.config.kernel}; without: " + "; ".join(self.without)


def express_pr2771(theirs: Pr2771Config, p: Problem, target: Target, kernels: dict | None = None) -> Expressed:
    """#2771's config on the first of PR2771_CLASSES our static rules admit; else what cannot be expressed (the
    feature behind the first rule it fails, with our rule's message)."""
    failed = []
    for name in PR2771_CLASSES:
        cfg = dataclasses.replace(theirs.config, kernel=name)
        verdict = check_backward(cfg, p.problem_class, target, kernels=kernels)
        if verdict:
            without = PR2771_ALWAYS + (
                (f"its {theirs.postprocess_dQ_threads}-thread dQ postprocess (ours runs the main kernel's "
                 f"{cfg.num_threads})",) if theirs.postprocess_dQ_threads != cfg.num_threads else ())
            return Expressed(cfg, without=without)
        failed.append((name, verdict))
    feature = "; ".join(dict.fromkeys(PR2771_FEATURES[v.rule] for _, v in failed if v.rule in PR2771_FEATURES)) or "its knobs"
    rules = "; ".join(f"{name}: rule {v.rule}: {v.message}" for name, v in failed)
    extra = "; and skip_full_causal_mask (a kernel argument of theirs)" if theirs.skip_full_causal_mask else ""
    return Expressed(None, cannot=f"{feature} ({rules}){extra}")


# ---- upstream's autotuner ----

OWN_TILES = ((128, 128), (128, 64))  # the SM120 tiles of upstream's select_initial_fwd_tile (b40)


def autotune_refusal(p: Problem) -> str:
    """Why upstream's autotuner cannot tune a forward problem ('' where it can): it is output-only for bf16/fp16, without
    a soft-cap (flash_attn/cute/autotune.py, _normalize_kwargs)."""
    if p.dtype not in TORCH_DTYPE_NAMES:
        return f"autotune takes bf16 and fp16 only, not {p.dtype}"
    if p.softcap:
        return "autotune does not support softcap"
    return ""


def fwd_inputs(config_module, p: Problem, num_sms: int):
    """Upstream's FwdHeuristicInputs for an SM120 call of the problem (as its interface builds them), with an LSE."""
    local = is_local(p.causal, p.window_size_left, p.window_size_right)
    window = (p.window_size_left, p.window_size_right) if local else (None, None)
    if p.causal and local:
        window = (window[0], 0)
    causal = p.causal and not local
    return config_module.FwdHeuristicInputs(
        device_arch=SM120_ARCH, num_sms=num_sms, dtype=TORCH_DTYPE_NAMES[p.dtype], head_dim=p.head_dim,
        head_dim_v=p.head_dim_v, num_heads=p.num_heads, num_heads_kv=p.num_heads_kv, batch_size=p.batch,
        total_q=p.batch * p.seqlen_q, total_k=p.batch * p.seqlen_k, max_seqlen_q=p.seqlen_q, max_seqlen_k=p.seqlen_k,
        causal=causal, local=local, window_size_left=window[0], window_size_right=window[1], has_lse=True)


def fwd_config(config_module, p: Problem, num_sms: int, tile_m: int, tile_n: int, pack_gqa: bool | None = None):
    """Upstream's FwdConfig for the problem with this tile (and pack_gqa; None: its selector's), derived and validated
    by its own config code (derive_fwd_config)."""
    inputs = fwd_inputs(config_module, p, num_sms)
    base = config_module.select_fwd_config(inputs)
    changes = dict(tile_m=tile_m, tile_n=tile_n)
    if pack_gqa is not None:
        changes["pack_gqa"] = pack_gqa
    return config_module.derive_fwd_config(base, inputs, **changes)


def as_ours(fwd) -> ForwardConfig:
    """An SM120 FwdConfig as the ForwardConfig it compiles to: upstream's class, 128 threads, one stage."""
    return ForwardConfig(tile_m=fwd.tile_m, tile_n=fwd.tile_n, num_threads=128, num_stages=1, Q_in_regs=False, kernel="sm120")


def autotune_own(config_module, p: Problem, num_sms: int, target: Target) -> list:
    """Upstream's own SM120 choices as autotuner candidates: its selector's tiles, pack_gqa both ways for GQA, the ones
    our static rules admit (at d256 neither fits 99 KB: an empty list)."""
    packs = (True, False) if p.num_heads != p.num_heads_kv else (False,)
    configs = []
    for tile_m, tile_n in OWN_TILES:
        ours = ForwardConfig(tile_m=tile_m, tile_n=tile_n, num_threads=128, num_stages=1, Q_in_regs=False, kernel="sm120")
        if check_forward(ours, p.problem_class, target):
            configs += [fwd_config(config_module, p, num_sms, tile_m, tile_n, pack) for pack in packs]
    return configs


def inexpressible(cfg: ForwardConfig) -> str:
    """What an SM120 FwdConfig cannot say of one of our forward configs ('' where it says all of it)."""
    if cfg.kernel != "sm120":
        return f"kernel {cfg.kernel} (FwdConfig runs upstream's class only)"
    if cfg.num_threads != 128:
        return "num_threads != 128 (its SM120 interface passes 128)"
    if cfg.num_stages != 1:
        return "num_stages != 1 (its SM120 interface passes 1)"
    if cfg.Q_in_regs:
        return "Q_in_regs (its SM120 interface passes False)"
    if cfg.extra:
        return "a kernel class's own knobs"
    return ""


def autotune_handover(config_module, p: Problem, num_sms: int, feasible: list[ForwardConfig]) -> tuple[list, dict[str, int]]:
    """Our feasible configs of the problem's class in the autotuner's format (distinct, in our order), and how many
    it cannot take, by reason."""
    configs, refused = [], {}
    for cfg in feasible:
        reason = inexpressible(cfg)
        if reason:
            refused[reason] = refused.get(reason, 0) + 1
            continue
        configs.append(fwd_config(config_module, p, num_sms, cfg.tile_m, cfg.tile_n))
    return list(dict.fromkeys(configs)), refused


def describe(fwd) -> str:
    """'128x64 pack_gqa' for an autotuner pick."""
    return f"{fwd.tile_m}x{fwd.tile_n}{' pack_gqa' if fwd.pack_gqa else ''}"
