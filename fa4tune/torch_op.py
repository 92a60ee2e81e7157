"""The tuned call as torch custom ops (`fa4tune::fwd`, `fa4tune::bwd`): a fake implementation for tracing and an
autograd formula, so that `torch.compile(model, fullgraph=True)` traces through a call with no graph break and
CUDA graphs capture it (the host's compile caches and config lookups run at the op's first eager call).

Inside the op, per call: the problem class (head dims, causal, GQA ratio, dtype, regime, sliding window, soft-cap,
page size), its entry in the dispatch tables in use (`use_tables`; else the loaded experiment module's TABLES; else
none: upstream's SM120 configs through our host path), the per-call features that entry's kernel class must run
(seqused: per-sequence KV lengths; paged: a page table; learnable_sink: a sink logit per query head) and an explicit
split count (`num_splits` above 1: the split-KV class's). Where the entry's class cannot run the call, upstream's SM120
config runs it (a paged call: ours for paged KV, fa4tune.defaults.paged_forward); a debug line on the "fa4tune" logger
says which config ran and why. A paged call is forward only. A learnable sink's gradient comes back from the backward
op (d(sink) after dq, dk, dv); `deterministic` runs the class's backward entry with that call knob set (dQ added in a
fixed order: kernels/backward_sm120.py). fa4tune.dropin routes a call here or to upstream's own functions.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass, replace

import torch

from fa4tune import api, defaults
from fa4tune.config import BackwardConfig, ConfigError, ForwardConfig, ProblemClass

log = logging.getLogger("fa4tune")
SPLIT_KERNEL = "sm120_splitkv"  # the kernel class an explicit num_splits > 1 runs (kernels/splitkv_forward_sm120.py)
_TABLES: list = []  # the tables use_tables handed over (last one wins)
_LOCK = threading.Lock()
_MEMO: dict = {}  # (tables id, class, features, num_splits, direction) -> Choice: lookups once per distinct call


def use_tables(tables) -> None:
    """The dispatch tables fa4tune's flash_attn_func / flash_attn_varlen_func run (e.g. experiment.TABLES)."""
    with _LOCK:
        _TABLES[:] = [tables]
        _MEMO.clear()


def tables_in_use():
    """The tables handed to use_tables; else the loaded experiment module's TABLES; else empty tables (every class
    runs upstream's SM120 config through our host path)."""
    if _TABLES:
        return _TABLES[0]
    from fa4tune.kernel_class import experiment_module

    module = experiment_module()
    return getattr(module, "TABLES", None) or _EMPTY


def registry_class(config) -> type:
    """The kernel class of a config from the registry (our classes, the loaded experiment module's)."""
    from fa4tune.kernel_class import backward_kernel, forward_kernel

    return backward_kernel(config.kernel) if isinstance(config, BackwardConfig) else forward_kernel(config.kernel)


_EMPTY = api.DispatchTables({}, {}, kernel_class=registry_class)


@dataclass(frozen=True)
class Choice:
    """The config a call runs in one direction and why (the debug line's words)."""

    config: ForwardConfig | BackwardConfig
    reason: str


def _kernel_class(tables):
    return getattr(tables, "kernel_class", None) or registry_class


def _missing(tables, config, needed: frozenset[str]) -> list[str]:
    from fa4tune.kernel_class import runs_features

    return sorted(needed - runs_features(_kernel_class(tables)(config)))


def forward_choice(tables, pc: ProblemClass, packed: bool, needed: frozenset[str], num_splits: int) -> Choice:
    """The forward config of a call: the class's entry (its varlen entry for a packed call); an explicit num_splits
    above 1 on the split-KV class (the entry's tiles where it is split-KV already); upstream's SM120 config where the
    entry's kernel class lacks a per-call feature (`needed`: seqused), ours for paged KV where that is a page table;
    one error naming the feature where neither runs the call."""
    found = tables.varlen_forward_config(pc) if packed else tables.forward_config(pc)
    resolution = getattr(tables, "resolution", None)
    reason = resolution("fwd", pc).describe() if resolution and not packed else f"{pc.name}: packed entry"
    if num_splits > 1 and not packed and not pc.window and not pc.softcap:
        split = found if found.kernel == SPLIT_KERNEL else replace(defaults.upstream_forward(pc), kernel=SPLIT_KERNEL,
                                                                   tile_m=64)
        found, reason = replace(split, extra={"num_splits": num_splits}), f"{reason}; num_splits={num_splits} on {SPLIT_KERNEL}"
    missing = _missing(tables, found, needed)
    if missing:
        paged = "paged" in needed
        found = defaults.paged_forward(pc) if paged else defaults.upstream_forward(pc)
        instead = "ours for paged KV" if paged else "upstream's SM120 config"
        reason = f"{reason}; its kernel does not run {', '.join(missing)}: {instead}"
        still = _missing(tables, found, needed)
        if still:
            raise ConfigError(f"kernel_{still[0]}", f"{pc.name}: no config runs {', '.join(still)} here ({reason})")
    return Choice(found, reason)


def backward_choice(tables, pc: ProblemClass, needed: frozenset[str], deterministic: bool = False) -> Choice:
    """The backward config of a call: the class's (one error naming the rules where none runs it); upstream's SM120
    backward where that config's kernel class lacks a per-call feature; with `deterministic`, that config with its
    call knob set (upstream's SM120 backward where its class has none), one error naming the rule where the class
    cannot run it (a sliding window: deterministic_local)."""
    tables.check_backward_runs(pc) if hasattr(tables, "check_backward_runs") else None
    found = tables.backward_config(pc)
    missing = _missing(tables, found, needed)
    choice = (Choice(defaults.upstream_backward(pc), f"{pc.name}: backward kernel lacks {', '.join(missing)}: upstream's")
              if missing else Choice(found, f"{pc.name}: backward {found.kernel}"))
    if not deterministic:
        return choice
    return _deterministic(tables, pc, choice)


def _deterministic(tables, pc: ProblemClass, choice: Choice) -> Choice:
    from fa4tune.feasibility import check_backward
    from fa4tune.targets import get_target

    config, reason = choice.config, choice.reason
    if "deterministic" not in getattr(_kernel_class(tables)(config), "call_knobs", {}):
        config, reason = defaults.upstream_backward(pc), f"{reason}; its kernel has no deterministic knob: upstream's"
    config = replace(config, extra={**config.extra_knobs, "deterministic": True})
    kernel = _kernel_class(tables)(config)
    verdict = check_backward(config, pc, get_target(getattr(tables, "target", None)), kernels={config.kernel: kernel})
    if not verdict:
        raise ConfigError(verdict.rule, f"deterministic backward of {pc.name}: {verdict.message}")
    return Choice(config, f"{reason}, deterministic (dQ in key-block order)")


def _memo(key, choose):
    with _LOCK:
        if key not in _MEMO:
            _MEMO[key] = choose()
        return _MEMO[key]


def _call(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k, causal,
          window_left, window_right, softcap, pack_gqa, page_table=None, learnable_sink=None):
    """The call's packing, extras and problem class."""
    packed = api.packing(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    extras = api.Extras(window_left, window_right, softcap, seqused_q, seqused_k, pack_gqa, page_table, learnable_sink)
    longest = (packed.max_seqlen_q, packed.max_seqlen_k) if packed else (max_seqlen_q, max_seqlen_k)
    return packed, extras, api.problem_class_of(q, k, v, causal, *longest, extras=extras)


def tuned_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor | None,
               cu_seqlens_k: torch.Tensor | None, seqused_q: torch.Tensor | None, seqused_k: torch.Tensor | None,
               page_table: torch.Tensor | None, max_seqlen_q: int | None, max_seqlen_k: int | None,
               softmax_scale: float | None, causal: bool, window_left: int | None, window_right: int | None,
               softcap: float, num_splits: int, pack_gqa: bool | None, return_lse: bool,
               learnable_sink: torch.Tensor | None = None, deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of the tuned forward for the call's class (the module's docstring: which config runs); the LSE is
    always computed (the backward reads it), `return_lse` says whether its gradient reaches the backward. With a page
    table, k and v are page pools (num_pages, page_size, kv heads, head_dim); the LSE and out include the learnable
    sink where given; `deterministic` is the backward's (kept for it)."""
    api.check_learnable_sink(q, learnable_sink)
    packed, extras, pc = _call(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
                               causal, window_left, window_right, softcap, pack_gqa, page_table, learnable_sink)
    tables = tables_in_use()
    choice = _memo((id(tables), "fwd", pc, packed is not None, extras.features(), num_splits),
                   lambda: forward_choice(tables, pc, packed is not None, extras.features(), num_splits))
    if log.isEnabledFor(logging.DEBUG):  # short() is a tenth of the op's own host time: only when it prints
        log.debug("fa4tune: tuned forward %s: %s (%s)", pc.name, choice.config.short(), choice.reason)
    scale = 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else softmax_scale
    return api.run_forward(_kernel_class(tables), q, k, v, causal, scale, choice.config, packed, extras)


forward_op = torch.library.custom_op("fa4tune::fwd", tuned_forward, mutates_args=(), device_types="cuda")


@forward_op.register_fake
def _forward_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, page_table, max_seqlen_q, max_seqlen_k,
                  softmax_scale, causal, window_left, window_right, softcap, num_splits, pack_gqa, return_lse,
                  learnable_sink=None, deterministic=False):
    api.check_learnable_sink(q, learnable_sink)
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))
    if cu_seqlens_q is None:  # upstream's LSE layouts: (batch, heads, seqlen) or packed (heads, total)
        lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
    else:
        lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    return out, lse


def tuned_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                lse: torch.Tensor, dlse: torch.Tensor | None, cu_seqlens_q: torch.Tensor | None,
                cu_seqlens_k: torch.Tensor | None, seqused_q: torch.Tensor | None, seqused_k: torch.Tensor | None,
                max_seqlen_q: int | None, max_seqlen_k: int | None, softmax_scale: float | None, causal: bool,
                window_left: int | None, window_right: int | None, softcap: float,
                learnable_sink: torch.Tensor | None = None, deterministic: bool = False,
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dsink) of the tuned backward for the call's class; dsink is d(learnable_sink) in the sink's dtype,
    an empty fp32 tensor without a sink (a custom op returns tensors only)."""
    packed, extras, pc = _call(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
                               causal, window_left, window_right, softcap, None, learnable_sink=learnable_sink)
    tables = tables_in_use()
    needed = extras.features(backward=True)
    choice = _memo((id(tables), "bwd", pc, packed is not None, needed, bool(deterministic)),
                   lambda: backward_choice(tables, pc, needed, bool(deterministic)))
    if log.isEnabledFor(logging.DEBUG):
        log.debug("fa4tune: tuned backward %s: %s (%s)", pc.name, choice.config.short(), choice.reason)
    threads = tables.preprocess_threads(pc, choice.config)
    scale = 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else softmax_scale
    dq, dk, dv, *dsink = api.run_backward(_kernel_class(tables), q, k, v, out, dout, lse, causal, scale, choice.config,
                                          threads, packed, extras, dlse)
    return dq, dk, dv, (dsink[0] if dsink else _no_sink_gradient(q))


def _no_sink_gradient(q: torch.Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=torch.float32, device=q.device)


backward_op = torch.library.custom_op("fa4tune::bwd", tuned_backward, mutates_args=(), device_types="cuda")


@backward_op.register_fake
def _backward_fake(dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q,
                   max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap, learnable_sink=None,
                   deterministic=False):
    dsink = _no_sink_gradient(q) if learnable_sink is None else torch.empty_like(learnable_sink)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dsink


_PLAIN_ARGS = ("max_seqlen_q", "max_seqlen_k", "softmax_scale", "causal", "window_left", "window_right", "softcap")
_FORWARD_ARGS = 20  # tuned_forward's parameters: autograd returns one gradient (or None) for each


def _setup_context(ctx, inputs, output):
    (q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, page_table, *plain, num_splits, pack_gqa, return_lse,
     learnable_sink, deterministic) = inputs
    ctx.paged = page_table is not None
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, learnable_sink)
    ctx.plain = dict(zip(_PLAIN_ARGS, plain))
    ctx.return_lse, ctx.deterministic = return_lse, deterministic


def _backward(ctx, dout, dlse):
    if ctx.paged:
        raise ConfigError("paged_forward_only", "a paged KV cache runs forward only (no gradient of its page pools)")
    q, k, v, out, lse, *saved, learnable_sink = ctx.saved_tensors
    dq, dk, dv, dsink = backward_op(dout, q, k, v, out, lse, dlse if ctx.return_lse else None, *saved, **ctx.plain,
                                    learnable_sink=learnable_sink, deterministic=ctx.deterministic)
    return (dq, dk, dv) + (None,) * (_FORWARD_ARGS - 5) + (None if learnable_sink is None else dsink, None)


forward_op.register_autograd(_backward, setup_context=_setup_context)
