"""Candidates: what a step runs. A forward is `forward(q, k, v, causal) -> (out, lse or None)`, differentiable
through autograd; q, k, v are (batch, seqlen, heads, head_dim). A packed (varlen) problem's call is
`forward(q, k, v, causal, cu_seqlens_q=..., cu_seqlens_k=..., max_seqlen_q=..., max_seqlen_k=...)` on (total, heads,
head_dim) tensors, its LSE (heads, total). A problem with a sliding window or a soft-cap adds `window_size=(left,
right)` and `softcap=...` (upstream's names; fa4tune.harness.gate.call_arguments), for the candidate and the reference;
a paged problem's k and v are page pools with `page_table=...` and `seqused_k=...` (gate.paging), forward only.

experiment.py's attention with a pair of configs (guarded: fa4tune.harness.guards' rules apply), upstream's SM120
defaults through it, FA4's own path for the local GPU and torch SDPA; each travels to a child process as a JSON
spec. `load_experiment` imports experiment.py (or a copy) as module `experiment`, once per source, where the
kernel-class registry finds it (fa4tune.kernel_class; this module registers its loader there too).
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from fa4tune import kernel_class
from fa4tune.config import BackwardConfig, ConfigError, ForwardConfig
from fa4tune.harness import gate, guards, isolation, runtime_guards, settings

# Candidate kinds a step can run (baseline names as printed).
EXPERIMENT, UPSTREAM_SM120, FA4_OWN_PATH, TORCH_SDPA = "experiment", "sm120 upstream", "fa4 own path", "torch sdpa"


@dataclass(frozen=True)
class Candidate:
    """A named attention implementation under test, and what the record says about it."""

    name: str
    forward: Callable
    config: dict
    guarded: bool = False  # experiment.py's code: gated under runtime_guards' trap and checks


def experiment_candidate(experiment_module, fwd_config: ForwardConfig, bwd_config: BackwardConfig, name: str = EXPERIMENT) -> Candidate:
    """experiment.attention with these configs."""

    def forward(q, k, v, causal, **packed):
        return experiment_module.attention(q, k, v, causal=causal, fwd_config=fwd_config, bwd_config=bwd_config, return_lse=True,
                                           **packed)

    return Candidate(name, forward, {"forward": fwd_config.to_dict(), "backward": bwd_config.to_dict()}, guarded=True)


def fa4_candidate() -> Candidate:
    """FlashAttention-4's public path for the local GPU (no arch override: SM90 kernels on an H200)."""
    from flash_attn.cute.interface import flash_attn_func, flash_attn_varlen_func

    def forward(q, k, v, causal, **arguments):
        if arguments.get("cu_seqlens_q") is not None or arguments.get("page_table") is not None:
            return flash_attn_varlen_func(q, k, v, causal=causal, return_lse=True, **arguments)
        out, lse = flash_attn_func(q, k, v, causal=causal, return_lse=True, **arguments)
        return out, lse

    return Candidate(FA4_OWN_PATH, forward, {"path": "flash_attn.cute.interface.flash_attn_func"})


def sdpa_candidate() -> Candidate:
    """torch.nn.functional.scaled_dot_product_attention (GQA through enable_gqa; no LSE to check); a packed call
    runs each sequence on its own and concatenates the outputs (what a caller without a varlen kernel would do); a
    sliding window through the gate's mask; a soft-cap SDPA cannot apply: one error (sdpa_softcap). A paged call gathers
    every sequence's pages into a padded cache on the device and masks the keys past its used length (what a caller
    without a paged kernel would do; no device-to-host copy)."""
    import torch
    import torch.nn.functional as F

    bounds: dict[int, tuple] = {}  # id(cu_seqlens) -> (the tensor, its offsets as ints): read to the host once

    def offsets(cu_seqlens) -> list[int]:
        # a device-to-host copy in each timed call would wait for the device, which the timing refuses
        # (block_covers_enqueue: every SDPA varlen row of 2026-12-06-h100-models-twins-varlen.md)
        known = bounds.get(id(cu_seqlens))
        if known is None or known[0] is not cu_seqlens:
            known = bounds[id(cu_seqlens)] = (cu_seqlens, cu_seqlens.tolist())
        return known[1]

    def forward(q, k, v, causal, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
                window_size=(-1, -1), softcap=0.0, page_table=None, seqused_k=None):
        if softcap:
            raise ConfigError("sdpa_softcap", f"torch SDPA has no soft-cap: softcap={softcap:g} (its scores are not capped)")
        if page_table is not None:
            return paged(q, k, v, causal, page_table, seqused_k), None
        if cu_seqlens_q is not None:
            bq, bk = offsets(cu_seqlens_q), offsets(cu_seqlens_k)
            outs = [forward(q[a:b][None], k[c:d][None], v[c:d][None], causal, window_size=window_size)[0][0]
                    for a, b, c, d in zip(bq, bq[1:], bk, bk[1:])]
            return torch.cat(outs), None
        seqlen_q, seqlen_k = q.shape[1], k.shape[1]
        mask, is_causal = None, causal
        if any(side >= 0 for side in window_size):  # a sliding window: the gate's mask, as a boolean keep-mask
            rows = torch.arange(seqlen_q, device=q.device)
            mask, is_causal = ~gate.window_mask(rows, seqlen_q, seqlen_k, seqlen_k, causal, window_size), False
        elif causal and seqlen_q != seqlen_k:
            # SDPA's is_causal is top-left aligned; FlashAttention's (and the gate's) is bottom-right
            mask = ~gate.causal_mask(torch.arange(seqlen_q, device=q.device), seqlen_q, seqlen_k, seqlen_k)
            is_causal = False
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, is_causal=is_causal,
            enable_gqa=q.shape[2] != k.shape[2],
        )
        return out.transpose(1, 2), None

    def paged(q, k, v, causal, page_table, seqused_k):
        batch, seqlen_q = q.shape[:2]
        keys, values = (pool[page_table.long()].flatten(1, 2) for pool in (k, v))  # (batch, pages * page_size, ...)
        cols = torch.arange(keys.shape[1], device=q.device)
        used = (seqused_k if seqused_k is not None else torch.full((batch,), keys.shape[1], device=q.device))[:, None, None]
        keep = cols[None, None, :] < used  # (batch, seqlen_q, keys): each sequence's used keys, bottom-right causal
        if causal:
            keep = keep & (cols[None, None, :] <= torch.arange(seqlen_q, device=q.device)[None, :, None] + used - seqlen_q)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                                             attn_mask=keep[:, None], enable_gqa=q.shape[2] != k.shape[2])
        return out.transpose(1, 2)

    return Candidate(TORCH_SDPA, forward, {"path": "torch.nn.functional.scaled_dot_product_attention"})


_EXPERIMENTS: dict[Path, tuple[str, object]] = {}  # path -> (sha256 of the source it ran, module)


def load_experiment(path: str | Path):
    """Import experiment.py (or a copy of it) from a path, as module `experiment`; the module already loaded
    from that path while its source is unchanged (its kernels' compile caches with it), else a fresh import."""
    path = Path(path).resolve()
    if not path.is_file():
        raise ConfigError("experiment_file", f"{str(path)!r} does not exist")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    known = _EXPERIMENTS.get(path)
    if known is not None and known[0] == digest:
        sys.modules["experiment"] = known[1]  # the kernels' classes look their module up by name
        return known[1]
    guards.admit(path)  # the static rules (experiment.py, kernels/) and the pin, before any of its code runs: guards.Refused
    cached = sys.modules.get("experiment")
    if known is None and cached is not None and Path(getattr(cached, "__file__", "")).resolve() == path:
        _EXPERIMENTS[path] = (digest, cached)  # imported by name (`import experiment`) before
        return cached
    runtime_guards.seal_harness()  # before experiment.py's code runs in this process
    spec = importlib.util.spec_from_file_location("experiment", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["experiment"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["experiment"]  # a later call must not get the half-imported module
        raise
    _EXPERIMENTS[path] = (digest, module)
    return module


def load_default_experiment():
    """experiment.py at the project root (fa4tune.harness.settings.EXPERIMENT_PATH), through load_experiment."""
    return load_experiment(settings.EXPERIMENT_PATH)


# the kernel-class registry receives experiment.py from here when a process asks for it before loading one
kernel_class.register_loader(load_default_experiment)


def candidate_from_spec(spec: dict) -> Candidate:
    """A Candidate from its JSON description (what travels to a child process)."""
    kind = spec["kind"]
    if kind in (EXPERIMENT, UPSTREAM_SM120):
        module = load_experiment(spec["experiment_path"])
        return experiment_candidate(
            module, ForwardConfig.from_dict(spec["fwd_config"]), BackwardConfig.from_dict(spec["bwd_config"]), spec["name"],
        )
    if kind == FA4_OWN_PATH:
        return fa4_candidate()
    if kind == TORCH_SDPA:
        return sdpa_candidate()
    if kind == "callable":
        # {"factory": "module:function"} returning a Candidate: any other implementation under test
        return isolation.resolve(spec["factory"])()
    raise ValueError(f"unknown candidate kind {kind!r}")


def experiment_spec(name: str, experiment_path: str | Path, fwd_config: ForwardConfig, bwd_config: BackwardConfig, kind: str = EXPERIMENT) -> dict:
    """JSON description of an experiment.attention candidate."""
    return {
        "name": name, "kind": kind, "experiment_path": str(experiment_path),
        "fwd_config": fwd_config.to_dict(), "bwd_config": bwd_config.to_dict(),
    }
