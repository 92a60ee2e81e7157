"""The public call path: `attention()` through the tuned SM120 kernels, each problem's configs from dispatch tables.

    import experiment                      # the tuned tables (FORWARD_DISPATCH, ...) and the kernel classes
    from fa4tune.api import attention
    out = attention(q, k, v, causal=True, tables=experiment.TABLES)

q, k, v are (batch, seqlen, heads, head_dim) CUDA tensors in bfloat16 or float16; gradients flow through the tuned
backward. `tables` is a DispatchTables (the tables as dicts, and the function that maps a config to its kernel
class), or any object with the same four methods (forward_config, backward_config, preprocess_threads,
kernel_class). experiment.py builds its TABLES from its own dicts; its `attention` calls this one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping

import torch

from fa4tune import defaults, fallback
from fa4tune.config import (FP8, BackwardConfig, ConfigError, ForwardConfig, ProblemClass, check_page_size, is_local,
                            regime_of)
from fa4tune.sm120_interface import build

_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
UPSTREAM_PREPROCESS_THREADS = 256


def _feasible_forward(kernel_class, target):
    def feasible(config: ForwardConfig, pc: ProblemClass):
        from fa4tune.feasibility import check_forward_entry

        try:
            kernels = {config.kernel: kernel_class(config)} if kernel_class else None
        except ConfigError:
            return False
        return check_forward_entry(config, pc, target, kernels)
    return feasible


def _target(name):
    from fa4tune.targets import get_target

    return get_target(name)


def _feasible_backward(target):
    def feasible(config: BackwardConfig, pc: ProblemClass):
        from fa4tune.feasibility import check_backward

        return check_backward(config, pc, target)
    return feasible


@dataclass(frozen=True)
class DispatchTables:
    """Problem class name -> config, per direction, and the preprocess's thread counts; a class without an entry runs
    its nearest tuned class's where that is feasible for it (fa4tune.fallback: the rule), else upstream's default.
    `kernel_class(config)` is the class that runs a config (the host path's compile caches are per kernel_class
    function: pass the same one each call)."""

    forward: Mapping[str, ForwardConfig]
    backward: Mapping[str, BackwardConfig]
    preprocess: Mapping[str, int] = field(default_factory=dict)
    kernel_class: Callable[[object], type] | None = None
    target: str | None = None  # fa4tune.targets name whose static rules a fallback entry must pass (None: sm120)
    varlen: Mapping[str, ForwardConfig] = field(default_factory=dict)  # packed calls' forward entries, where measured
    _resolved: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def resolution(self, direction: str, pc: ProblemClass) -> fallback.Resolution:
        """Which entry runs `pc` in direction 'fwd' or 'bwd', and why (fa4tune.fallback), memoized per class."""
        key = (direction, pc)
        if key not in self._resolved:
            target = _target(self.target)
            table, feasible = ((self.forward, _feasible_forward(self.kernel_class, target)) if direction == "fwd"
                               else (self.backward, _feasible_backward(target)))
            self._resolved[key] = fallback.resolve(pc, table, feasible, defaults.fallback_configs(direction, pc))
        return self._resolved[key]

    def forward_config(self, pc: ProblemClass) -> ForwardConfig:
        """The class's forward config (fa4tune.fallback); one error naming the rules where none runs it."""
        found = self.resolution("fwd", pc)
        if found.rule == "none":
            raise ConfigError("no_feasible_config", f"forward: {found.describe()}")
        return found.config or defaults.upstream_forward(pc)

    def backward_config(self, pc: ProblemClass) -> BackwardConfig:
        """The class's backward config; where none runs it, upstream's (what a forward-only caller passes along:
        `check_backward_runs` raises before a backward would)."""
        return self.resolution("bwd", pc).config or defaults.upstream_backward(pc)

    def check_backward_runs(self, pc: ProblemClass) -> None:
        """One error naming the rules where no backward config runs the class (a d256 causal backward, say)."""
        found = self.resolution("bwd", pc)
        if found.rule == "none":
            raise ConfigError("no_feasible_config", f"backward: {found.describe()}")

    def varlen_forward_config(self, pc: ProblemClass) -> ForwardConfig:
        """The forward config of a packed (varlen) call of the class: its `varlen` entry (measured on packed batches);
        else its config where its kernel class runs packed batches (`varlen`); else upstream's default, else ours for
        wide heads on upstream's class. An entry's knobs are not carried over to upstream's class: tuned for another
        kernel, they read 0.86-0.95x upstream's forward on packed d64 and d96 batches, but under a place bias that read
        identical configs at 0.77-0.91x (docs/measurements/2026-12-05-h100-upstream-tests-and-varlen-order.md): until the
        rerun, upstream's default, which is 1.0x by construction."""
        from fa4tune.kernel_class import forward_kernel, runs_varlen

        key = ("varlen", pc)
        if key in self._resolved:
            return self._resolved[key]
        kernel_class = self.kernel_class or (lambda c: forward_kernel(c.kernel))
        feasible = _feasible_forward(self.kernel_class, _target(self.target))
        own = self.varlen.get(pc.name)
        if own is not None:
            if not runs_varlen(kernel_class(own)):
                raise ConfigError("varlen_entry", f"{pc.name}: the varlen entry's kernel {own.kernel!r} does not run "
                                  "packed batches (only a class that declares varlen = True does)")
            verdict = feasible(own, pc)
            if not verdict:
                raise ConfigError(verdict.rule, f"{pc.name}: varlen entry: {verdict.message}")
            config = own
        else:
            config = self.forward_config(pc)
        if not runs_varlen(kernel_class(config)):
            candidates = (defaults.upstream_forward(pc), replace(defaults.wide_forward(pc), kernel=defaults.UPSTREAM_KERNEL))
            config = next((c for c in candidates if feasible(c, pc)), None)
            if config is None:
                raise ConfigError("no_feasible_config", f"varlen forward: no config of upstream's class runs {pc.name}")
        self._resolved[key] = config
        return config

    def preprocess_threads(self, pc: ProblemClass, bwd_config: BackwardConfig) -> int:
        """The backward preprocess's thread count: its own entry (a one-line error that names the rule for a count
        the kernel cannot run), else a neighbour's that runs with `bwd_config` (the fallback rule), else 256."""
        from fa4tune.feasibility import check_preprocess_threads

        own = self.preprocess.get(pc.name)
        if own is not None:
            verdict = check_preprocess_threads(own, bwd_config, pc)
            if not verdict:
                raise ConfigError(verdict.rule, f"{pc.name}: {verdict.message}")
            return own
        found = fallback.resolve(pc, self.preprocess, lambda threads, c: check_preprocess_threads(threads, bwd_config, c))
        return found.config or UPSTREAM_PREPROCESS_THREADS


def problem_class_of(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                     max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
                     extras: "Extras | None" = None) -> ProblemClass:
    """The problem class of (batch, seqlen, heads, head_dim) tensors, or of packed (total, heads, head_dim) ones with
    their longest sequences (the regime of a packed batch is its longest sequence's), with the call's sliding window,
    soft-cap and page table (`extras`; a paged cache's sequences hold up to a table row's pages of keys); one-line
    errors for bad input."""
    if q.dtype not in _DTYPE_NAMES:
        raise ConfigError("dtype", f"dtype must be bfloat16 or float16, got {q.dtype}")
    extras = extras or Extras()
    page_size = k.shape[1] if extras.page_table is not None else 0
    seqlen_q = q.shape[-3] if max_seqlen_q is None else max_seqlen_q
    seqlen_k = (k.shape[-3] if not page_size else extras.page_table.shape[1] * page_size) if max_seqlen_k is None else max_seqlen_k
    return ProblemClass(q.shape[-1], v.shape[-1], causal, q.shape[-2] // k.shape[-2], _DTYPE_NAMES[q.dtype],
                        regime_of(seqlen_q, seqlen_k, causal), window=extras.local(causal), softcap=extras.softcap > 0,
                        page_size=page_size)


def check_paging(q, k, v, page_table, cu_seqlens_k=None) -> None:
    """One-line errors naming the rule for a malformed paged call: a page table of int32 (batch, pages per sequence)
    and K / V page pools (num_pages, page_size, kv heads, head dim) with a page size of config.PAGE_SIZES."""
    if page_table.dtype != torch.int32 or page_table.dim() != 2:
        raise ConfigError("page_table", f"page_table must be a 2-d int32 tensor (batch, pages per sequence), got "
                                        f"{page_table.dtype} {tuple(page_table.shape)}")
    if cu_seqlens_k is not None:
        raise ConfigError("page_table", "a paged call takes seqused_k for its sequences' lengths, not cu_seqlens_k")
    if q.dim() != 4 or page_table.shape[0] != q.shape[0]:
        raise ConfigError("page_table", f"page_table has {page_table.shape[0]} rows; q {tuple(q.shape)} must be "
                                        "(batch, seqlen, heads, head_dim) with one row per sequence")
    if k.dim() != 4 or v.dim() != 4 or k.shape[:2] != v.shape[:2]:
        raise ConfigError("paged_kv_layout", f"a paged call's k and v are page pools (num_pages, page_size, kv heads, "
                                             f"head_dim) of the same pages, got {tuple(k.shape)} and {tuple(v.shape)}")
    check_page_size(int(k.shape[1]))


SINK_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # upstream's (interface._LEARNABLE_SINK_DTYPES)


def check_learnable_sink(q: torch.Tensor, learnable_sink: torch.Tensor | None) -> None:
    """One error naming the rule for a learnable sink that is not one logit per query head: shape (num_heads,), a
    float dtype of upstream's (fp32, bf16, fp16), on q's device."""
    if learnable_sink is None:
        return
    heads = q.shape[-2]
    if not isinstance(learnable_sink, torch.Tensor):
        raise ConfigError("learnable_sink_tensor", f"learnable_sink must be a tensor of one logit per query head, got "
                                                   f"{type(learnable_sink).__name__}")
    if tuple(learnable_sink.shape) != (heads,):
        raise ConfigError("learnable_sink_shape", f"learnable_sink must have shape (num_heads,) = ({heads},), one logit "
                                                  f"per query head, got {tuple(learnable_sink.shape)}")
    if learnable_sink.dtype not in SINK_DTYPES:
        raise ConfigError("learnable_sink_dtype", f"learnable_sink must be float32, bfloat16 or float16, got "
                                                  f"{learnable_sink.dtype}")
    if learnable_sink.device != q.device:
        raise ConfigError("learnable_sink_device", f"learnable_sink must be on q's device {q.device}, got "
                                                   f"{learnable_sink.device}")


@dataclass(frozen=True)
class Extras:
    """A call's arguments beyond its shape that reach the host path as upstream's own: the sliding window (upstream's
    window_size sides; None or -1: no limit), the soft-cap (0: none), per-sequence lengths (seqused_q / seqused_k:
    a padded KV cache's used lengths), pack_gqa (None: upstream's choice), a paged KV cache's page table (int32
    (batch, pages per sequence); k and v are then page pools; forward only) and a learnable sink (one logit per query
    head, gpt-oss's: an extra softmax column with no value; its gradient comes back from the backward)."""

    window_size_left: int | None = None
    window_size_right: int | None = None
    softcap: float = 0.0
    seqused_q: torch.Tensor | None = None
    seqused_k: torch.Tensor | None = None
    pack_gqa: bool | None = None
    page_table: torch.Tensor | None = None
    learnable_sink: torch.Tensor | None = None

    def local(self, causal: bool) -> bool:
        """Whether the window masks as a sliding window (fa4tune.config.is_local, upstream's rule)."""
        return is_local(causal, self.window_size_left, self.window_size_right)

    def features(self, backward: bool = False) -> frozenset[str]:
        """The per-call features (fa4tune.kernel_class.FEATURES) beyond the class's that a kernel class must run:
        per-sequence lengths (seqused: of the keys, seqused_q: of the queries), a page table (paged) and, forward only,
        the learnable sink (the backward kernel reads it in the forward's LSE; the host's postprocess reduces its
        gradient)."""
        used = (("seqused", self.seqused_k), ("seqused_q", self.seqused_q), ("paged", self.page_table),
                ("learnable_sink", None if backward else self.learnable_sink))
        return frozenset(name for name, value in used if value is not None)

    def backward_args(self) -> dict:
        """The host backward's keyword arguments for these extras (window, soft-cap, per-sequence lengths, sink)."""
        return dict(window_size_left=self.window_size_left, window_size_right=self.window_size_right,
                    softcap=self.softcap, seqused_q=self.seqused_q, seqused_k=self.seqused_k,
                    learnable_sink=self.learnable_sink)

    def forward_args(self) -> dict:
        """The host forward's keyword arguments (the backward's, pack_gqa and the page table)."""
        return dict(self.backward_args(), pack_gqa=self.pack_gqa, page_table=self.page_table)


NO_EXTRAS = Extras()


@dataclass(frozen=True)
class Packed:
    """A varlen call's packing: cumulative sequence starts (int32, batch + 1) and the longest sequences."""

    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int

    def args(self) -> dict:
        return dict(cu_seqlens_q=self.cu_seqlens_q, cu_seqlens_k=self.cu_seqlens_k, max_seqlen_q=self.max_seqlen_q,
                    max_seqlen_k=self.max_seqlen_k)


def packing(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) -> Packed | None:
    """The call's Packed (None for padded tensors); one-line errors naming the rule for a malformed one."""
    if cu_seqlens_q is None and cu_seqlens_k is None:
        return None
    if cu_seqlens_q is None or cu_seqlens_k is None:
        raise ConfigError("varlen_cu_seqlens", "a packed call needs both cu_seqlens_q and cu_seqlens_k")
    for name, t, x in (("cu_seqlens_q", cu_seqlens_q, q), ("cu_seqlens_k", cu_seqlens_k, k)):
        if t.dtype != torch.int32 or t.dim() != 1 or t.numel() < 2:
            raise ConfigError("varlen_cu_seqlens", f"{name} must be a 1-d int32 tensor of batch + 1 offsets, got {t.dtype} {tuple(t.shape)}")
        if x.dim() != 3:
            raise ConfigError("varlen_layout", f"a packed call takes (total, heads, head_dim) tensors, got {tuple(x.shape)}")
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise ConfigError("varlen_cu_seqlens", f"cu_seqlens_q and cu_seqlens_k must have the same length (batch + 1), got "
                                               f"{cu_seqlens_q.numel()} and {cu_seqlens_k.numel()}")
    max_q = int(cu_seqlens_q.diff().max()) if max_seqlen_q is None else max_seqlen_q  # only then: a device sync
    max_k = int(cu_seqlens_k.diff().max()) if max_seqlen_k is None else max_seqlen_k
    return Packed(cu_seqlens_q, cu_seqlens_k, max_q, max_k)


def run_forward(kernel_class, q, k, v, causal, softmax_scale, fwd_config, packed=None, extras=NO_EXTRAS):
    """(out, lse) of the tuned host forward (fa4tune.sm120_interface) with `fwd_config` on the kernel class
    `kernel_class(fwd_config)` gives; the extras (window, soft-cap, seqused, pack_gqa) reach it as upstream's."""
    varlen = packed.args() if packed is not None else {}
    out, lse, *_ = build(kernel_class).flash_attn_fwd(
        q, k, v, softmax_scale=softmax_scale, causal=causal, tile_mn=(fwd_config.tile_m, fwd_config.tile_n),
        return_lse=True, sm120_config=fwd_config, **varlen, **extras.forward_args(),
    )
    return out, lse


def run_backward(kernel_class, q, k, v, out, dout, lse, causal, softmax_scale, bwd_config, preprocess_threads,
                 packed=None, extras=NO_EXTRAS, dlse=None):
    """(dq, dk, dv) of the tuned host backward with `bwd_config` (dlse: the LSE's gradient where a caller used it), and
    d(learnable_sink) after them where the call has a sink; `deterministic` in the config's knobs: dQ (and GQA's dK/dV)
    added in a fixed order (kernels/backward_sm120.py), on the host's counters."""
    varlen = packed.args() if packed is not None else {}
    return build(kernel_class).flash_attn_bwd(
        q, k, v, out, dout.contiguous(), lse, softmax_scale=softmax_scale, causal=causal, sm120_config=bwd_config,
        sm120_preprocess_threads=preprocess_threads, dlse=dlse, deterministic=is_deterministic(bwd_config), **varlen,
        **extras.backward_args(),
    )


def is_deterministic(bwd_config: BackwardConfig) -> bool:
    """Whether a backward config asks for the fixed-order backward (its call knob `deterministic`)."""
    return bool(bwd_config.extra_knobs.get("deterministic", False))


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, softmax_scale, fwd_config, bwd_config, preprocess_threads, kernel_class, packed=None,
                extras=NO_EXTRAS):
        out, lse = run_forward(kernel_class, q, k, v, causal, softmax_scale, fwd_config, packed, extras)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.softmax_scale, ctx.bwd_config = causal, softmax_scale, bwd_config
        ctx.preprocess_threads, ctx.kernel_class, ctx.packed, ctx.extras = preprocess_threads, kernel_class, packed, extras
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = run_backward(ctx.kernel_class, q, k, v, out, dout, lse, ctx.causal, ctx.softmax_scale, ctx.bwd_config,
                                  ctx.preprocess_threads, ctx.packed, ctx.extras)
        return dq, dk, dv, None, None, None, None, None, None, None, None


def attention(q, k, v, causal=False, softmax_scale=None, fwd_config=None, bwd_config=None, return_lse=False, *,
              tables, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, fp8=False,
              window_size=(None, None), softcap=0.0, page_table=None, seqused_k=None):
    """softmax(q k^T * scale) v for (batch, seqlen, heads, head_dim) tensors through the SM120 kernels.

    Configs default to `tables`' entries for the problem class; gradients flow through the tuned backward kernel.
    Packed batches of mixed lengths (varlen): (total, heads, head_dim) tensors with `cu_seqlens_q` / `cu_seqlens_k`
    (int32 offsets, batch + 1; causal masks each sequence by its own end, as upstream's varlen path does), and
    `max_seqlen_q` / `max_seqlen_k` (read from the offsets when not given: one device-to-host copy). The class is
    the longest sequences'; its varlen entry runs, else its entry where its kernel class runs packed batches, else
    upstream's default (`DispatchTables.varlen_forward_config`).
    FP8 is opt-in: `fp8=True` (bf16 q, k, v) runs the "fp8" class's entry, and a config whose kernel class quantizes
    (sm120_fp8) runs through fa4tune.fp8 (K smoothed, Q and K in e4m3 per tile; forward only, no packed batches).
    A sliding window (`window_size`, upstream's (left, right)) and a soft-cap (`softcap`) are class dimensions: the
    window or softcap class's entry runs them (fa4tune.fallback: upstream's default where it has none).
    A paged KV cache (vLLM-style): k and v are page pools (num_pages, page_size, kv heads, head_dim), `page_table`
    int32 (batch, pages per sequence) names each sequence's pages in order and `seqused_k` (int32, batch) its used
    keys (None: every table row's pages, whole); the page size is a class dimension; forward only.
    """
    if page_table is not None:
        check_paging(q, k, v, page_table, cu_seqlens_k)
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            raise ConfigError("paged_forward_only", "a paged KV cache runs forward only: call it under torch.no_grad()")
    packed = packing(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    extras = Extras(*window_size, softcap=softcap, seqused_k=seqused_k, page_table=page_table)
    pc = problem_class_of(q, k, v, causal, *((packed.max_seqlen_q, packed.max_seqlen_k) if packed else (None, None)),
                          extras=extras)
    if fp8 or (fwd_config is not None and _quantizes(tables, fwd_config)):
        return _fp8_attention(q, k, v, causal, softmax_scale, fwd_config, return_lse, replace(pc, dtype=FP8), tables, packed)
    if packed is not None and fwd_config is None:
        fwd_config = tables.varlen_forward_config(pc)
    fwd_config = fwd_config or tables.forward_config(pc)
    if extras.features():  # per-call features (seqused_k, a page table): the config's kernel class must run them
        _check_runs(tables, fwd_config, extras.features())
    if bwd_config is None and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        getattr(tables, "check_backward_runs", lambda pc: None)(pc)  # before the forward, not after it
    bwd_config = bwd_config or tables.backward_config(pc)
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[-1])
    out, lse = _Attention.apply(q, k, v, causal, softmax_scale, fwd_config, bwd_config,
                                tables.preprocess_threads(pc, bwd_config), tables.kernel_class, packed, extras)
    return (out, lse) if return_lse else out


def _check_runs(tables, config: ForwardConfig, needed: frozenset[str]) -> None:
    """One error naming the first per-call feature the config's kernel class does not run (kernel_<feature>)."""
    from fa4tune.kernel_class import forward_kernel, runs_features

    kernel_class = getattr(tables, "kernel_class", None) or (lambda c: forward_kernel(c.kernel))
    missing = sorted(needed - runs_features(kernel_class(config)))
    if missing:
        raise ConfigError(f"kernel_{missing[0]}", f"kernel {config.kernel!r} does not run {missing[0]} (only a class "
                                                  f"that declares {missing[0]!r} in its features does)")


def _quantizes(tables, config: ForwardConfig) -> bool:
    """Whether the config's kernel class takes bf16 inputs and computes in FP8 (fa4tune.kernel_class `quantizes`)."""
    from fa4tune.kernel_class import forward_kernel

    kernel_class = getattr(tables, "kernel_class", None) or (lambda c: forward_kernel(c.kernel))
    return bool(getattr(kernel_class(config), "quantizes", False))


def _fp8_attention(q, k, v, causal, softmax_scale, fwd_config, return_lse, pc: ProblemClass, tables, packed):
    """The opt-in FP8 forward (fa4tune.fp8) with the fp8 class's config; one error for what it does not run."""
    from fa4tune import fp8

    if packed is not None:
        raise ConfigError("fp8_varlen", "the FP8 forward takes (batch, seqlen, heads, head_dim) tensors, not packed batches")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise ConfigError("fp8_forward_only", f"the FP8 path has no backward ({pc.name}): call it under torch.no_grad(), "
                                              "or train in bf16 / fp16")
    out, lse = fp8.attention_fp8(q, k, v, causal, softmax_scale, fwd_config or tables.forward_config(pc), return_lse=True)
    return (out, lse) if return_lse else out
