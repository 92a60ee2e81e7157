"""flash-attn-4's two public functions with the pinned release's parameters, tuned: `flash_attn_func` and
`flash_attn_varlen_func` (`fa4tune.flash_attn_func`, or `from fa4tune import flash_attn_func`, in place of
`from flash_attn.cute import ...`; the package loads this module on first use, so `import fa4tune` stays light).

A call runs our tuned entry for its problem class (fa4tune.torch_op: a torch custom op, so torch.compile traces it
whole; a learnable sink and deterministic=True included, with the sink's gradient through autograd) unless it sets an
argument our kernels do not run (UPSTREAM_ONLY, or fp8 inputs, MLA's shared K/V, one-sided packing, tensor sequence
bounds; with a page table: gradients, packed queries, seqused_q, a window or a soft-cap): then upstream's own function
runs with the same arguments, so a call never fails here where upstream's runs. A paged KV cache (`page_table`, vLLM's
block tables; k and v page pools of 16 to 256 tokens a page) runs our split-KV class; a malformed one (the table's
dtype or shape, a page size) is one error naming the rule. A debug line on the "fa4tune" logger says which ran and
why. Returns as upstream's:
(out, lse), lse None unless return_lse. `num_splits`: 1 (upstream's default) or below lets the entry choose (a decode
entry splits the KV sequence); above 1 runs that many splits on the split-KV class.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional, Tuple

import torch

from fa4tune import api, torch_op
from fa4tune.config import is_local

log = logging.getLogger("fa4tune")
_DTYPES = (torch.bfloat16, torch.float16)
# Upstream's arguments whose feature our kernels or our op do not carry: set (not None; True for the flags), the call
# runs upstream's function. Why each: callables and block-sparse structures cannot cross a custom op, and our SM120
# classes have no MLA (qv, gather), scales or upstream config. Paged KV, a learnable sink and the deterministic
# backward run ours (issue 71; upstream's SM120 path refuses all three).
UPSTREAM_ONLY = ("qv", "gather_kv_indices", "score_mod", "score_mod_bwd", "mask_mod", "aux_tensors",
                 "aux_scalars", "block_sparse_tensors", "block_sparse_tensors_bwd", "scheduler_metadata",
                 "seqlen_k_per_split", "min_seqlen_k", "gather_bwd_token_chunk", "config", "scales")
UPSTREAM_FLAGS = ("gather_bwd_recompute_p", "disable_scheduler_metadata")


def upstream_reason(q, k, v, arguments: dict) -> str | None:
    """Why a call runs upstream's function (one phrase), or None where our tuned path runs it."""
    for name in UPSTREAM_ONLY:
        if arguments.get(name) is not None:
            return f"{name} is set (our SM120 kernels do not run it)"
    for name in UPSTREAM_FLAGS:
        if arguments.get(name):
            return f"{name}=True (our SM120 kernels do not run it)"
    if q is None or k is None or q.dtype not in _DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"dtype {None if q is None else q.dtype} (ours: bfloat16, float16)"
    if q.shape[-1] % 8 or v.shape[-1] % 8:
        return f"head dims {q.shape[-1]}, {v.shape[-1]} (ours: multiples of 8)"
    if arguments.get("page_table") is not None:
        if (reason := _paged_reason(q, k, v, arguments)) is not None:
            return reason
    if (arguments.get("cu_seqlens_q") is None) != (arguments.get("cu_seqlens_k") is None):
        return "cu_seqlens on one side only (ours: both or neither)"
    if any(torch.is_tensor(arguments.get(name)) for name in ("max_seqlen_q", "max_seqlen_k")):
        return "max_seqlen given as a tensor (ours: Python integers)"
    return None


def _paged_reason(q, k, v, arguments: dict) -> str | None:
    """Why a paged call runs upstream's function (our paged class, kernels/splitkv_forward_sm120.py, runs a padded
    batch of queries forward, without a window or soft-cap), or None."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        return "page_table with gradients (our paged path is forward only)"
    if arguments.get("cu_seqlens_q") is not None or arguments.get("seqused_q") is not None:
        return "page_table with packed queries or seqused_q (ours: a padded (batch, seqlen) of queries)"
    left, right = arguments["window_size"]
    if is_local(arguments["causal"], left, right) or arguments["softcap"]:
        return "page_table with a sliding window or a soft-cap (our paged class runs neither)"
    if arguments.get("learnable_sink") is not None:
        return "learnable_sink is set with a page_table (the two are not gated together on a GPU yet)"
    return None


def _tuned(q, k, v, a: dict):
    """(out, lse or None) through the tuned custom op (one error naming the rule for a malformed learnable sink)."""
    left, right = a["window_size"]
    sink = a["learnable_sink"]
    api.check_learnable_sink(q, sink)
    out, lse = torch_op.forward_op(q, k, v, a.get("cu_seqlens_q"), a.get("cu_seqlens_k"), a.get("seqused_q"),
                                   a.get("seqused_k"), a.get("page_table"), a.get("max_seqlen_q"), a.get("max_seqlen_k"), a["softmax_scale"],
                                   a["causal"], left, right, float(a["softcap"] or 0.0), int(a["num_splits"]),
                                   a["pack_gqa"], bool(a["return_lse"]), sink, bool(a["deterministic"]))
    return out, (lse if a["return_lse"] else None)


def _route(name: str, arguments: dict):
    """Upstream's function `name` with the same arguments where upstream_reason gives a reason, else ours."""
    q, k, v = arguments["q"], arguments["k"], arguments["v"]
    if arguments.get("page_table") is not None and q is not None and k is not None:
        api.check_paging(q, k, v, arguments["page_table"], arguments.get("cu_seqlens_k"))  # bad input: one error
    reason = upstream_reason(q, k, v, arguments)
    if reason is None:
        return _tuned(q, k, v, arguments)
    from flash_attn.cute import interface

    log.debug("fa4tune: upstream's %s: %s", name, reason)
    return getattr(interface, name)(**arguments)


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    qv: Optional[torch.Tensor] = None,
    gather_kv_indices: Optional[torch.Tensor] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[Optional[int], Optional[int]] = (None, None),
    learnable_sink: Optional[torch.Tensor] = None,
    softcap: float = 0.0,
    num_splits: int = 1,
    pack_gqa: Optional[bool] = None,
    deterministic: bool = False,
    score_mod: Optional[Callable] = None,
    score_mod_bwd: Optional[Callable] = None,
    mask_mod: Optional[Callable] = None,
    aux_tensors: Optional[list] = None,
    aux_scalars: Optional[tuple] = None,
    block_sparse_tensors=None,
    block_sparse_tensors_bwd=None,
    return_lse: bool = False,
    gather_bwd_recompute_p: bool = False,
    gather_bwd_token_chunk: Optional[int] = None,
    config=None,
    scales=None,
):
    """Upstream's flash_attn_func (flash_attn.cute.interface, the pinned release), tuned: (batch, seqlen, heads,
    head_dim) tensors; the module's docstring says which path runs a call."""
    arguments = dict(q=q, k=k, v=v, qv=qv, gather_kv_indices=gather_kv_indices, softmax_scale=softmax_scale,
                     causal=causal, window_size=window_size, learnable_sink=learnable_sink, softcap=softcap,
                     num_splits=num_splits, pack_gqa=pack_gqa, deterministic=deterministic, score_mod=score_mod,
                     score_mod_bwd=score_mod_bwd, mask_mod=mask_mod, aux_tensors=aux_tensors,
                     aux_scalars=aux_scalars, block_sparse_tensors=block_sparse_tensors,
                     block_sparse_tensors_bwd=block_sparse_tensors_bwd, return_lse=return_lse,
                     gather_bwd_recompute_p=gather_bwd_recompute_p, gather_bwd_token_chunk=gather_bwd_token_chunk,
                     config=config, scales=scales)  # not locals(): Dynamo cannot trace it
    return _route("flash_attn_func", arguments)


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    qv: Optional[torch.Tensor] = None,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_k: Optional[torch.Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    max_seqlen_k: Optional[int] = None,
    min_seqlen_k: Optional[int] = None,
    seqused_q: Optional[torch.Tensor] = None,
    seqused_k: Optional[torch.Tensor] = None,
    gather_kv_indices: Optional[torch.Tensor] = None,
    page_table: Optional[torch.Tensor] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[Optional[int], Optional[int]] = (None, None),
    learnable_sink: Optional[torch.Tensor] = None,
    softcap: float = 0.0,
    num_splits: int = 1,
    pack_gqa: Optional[bool] = None,
    deterministic: bool = False,
    score_mod: Optional[Callable] = None,
    score_mod_bwd: Optional[Callable] = None,
    mask_mod: Optional[Callable] = None,
    block_sparse_tensors=None,
    aux_tensors: Optional[list] = None,
    aux_scalars: Optional[tuple] = None,
    return_lse: bool = False,
    scheduler_metadata=None,
    seqlen_k_per_split: Optional[int] = None,
    disable_scheduler_metadata: bool = False,
    gather_bwd_recompute_p: bool = False,
    gather_bwd_token_chunk: Optional[int] = None,
    config=None,
    scales=None,
):
    """Upstream's flash_attn_varlen_func, tuned: packed (total, heads, head_dim) tensors with cu_seqlens_q/k, or
    (batch, seqlen, heads, head_dim) ones with seqused_k (a KV cache's used lengths); see the module's docstring."""
    arguments = dict(q=q, k=k, v=v, qv=qv, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                     max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, min_seqlen_k=min_seqlen_k,
                     seqused_q=seqused_q, seqused_k=seqused_k, gather_kv_indices=gather_kv_indices,
                     page_table=page_table, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                     learnable_sink=learnable_sink, softcap=softcap, num_splits=num_splits, pack_gqa=pack_gqa,
                     deterministic=deterministic, score_mod=score_mod, score_mod_bwd=score_mod_bwd,
                     mask_mod=mask_mod, block_sparse_tensors=block_sparse_tensors, aux_tensors=aux_tensors,
                     aux_scalars=aux_scalars, return_lse=return_lse, scheduler_metadata=scheduler_metadata,
                     seqlen_k_per_split=seqlen_k_per_split, disable_scheduler_metadata=disable_scheduler_metadata,
                     gather_bwd_recompute_p=gather_bwd_recompute_p, gather_bwd_token_chunk=gather_bwd_token_chunk,
                     config=config, scales=scales)  # not locals(): Dynamo cannot trace it
    return _route("flash_attn_varlen_func", arguments)
