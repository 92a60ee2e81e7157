"""Upstream's host path (flash_attn.cute.interface) with every SM120 knob passed through.

flash-attn-4 4.0.0b40 selects a typed config per call (`FwdConfig` / `BwdConfig` from flash_attn/cute/config.py)
and validates it: for SM120 the forward takes a tile (`tile_mn`) but one split, 128 threads, one stage and no
Q_in_regs (all written into its constructor call), and `validate_bwd_config` refuses every backward config but
upstream's one default. Rather than copy ~2,000 lines of host code, we take the pinned version's source of the host
functions, make a few exact, checked edits (each must match once, else we stop with an error naming the
flash-attn-4 version), and compile them into a private copy of the interface module's namespace. Upstream's module
is not modified.

The edits: a `sm120_config` argument; after upstream's selection and validation, the forward's FwdConfig gets our
split count and the backward's BwdConfig our knobs (`sm120_bwd_config`); the constructor takes our threads, stages,
Q_in_regs and the kernel class's own knobs (`extra`); the kernel class comes from the config (`kernel_class(config)`);
our key (config + class) leads every compile key; the postprocess uses the main kernel's thread count; a learnable
sink's backward and the deterministic backward pass upstream's SM120 guards (the sink's gradient comes from upstream's
dQ postprocess; `deterministic` must agree with the config's call knob, and the dQ / dK / dV counters are made as the
other scratch tensors, so they fake-compile); the preprocess's thread count is an argument (`sm120_preprocess_threads`, in its compile key: `_bwd_preprocess` and
`_compile_bwd_preprocess` are rewritten for it); the arch is always SM120 (SM80 `mma.sync` code, compiled for
whatever GPU is present, or for sm_120a when CUTE_DSL_ARCH says so), with the local GPU's SM count. Split-KV: the
number of splits is the kernel class's `num_splits_for(config, problem, num_sms)` (1 unless the class splits);
above 1, upstream's own split path runs unchanged (fp32 `out_partial` (splits, b, s, h, d) and `lse_partial`
(splits, b, h, s) into the kernel, then upstream's combine kernel, `_flash_attn_fwd_combine`). The combine is
upstream's kernel, launched as a programmatic dependent launch (PDL, `use_pdl`) when COMBINE_PDL is set (the
default): its CTAs are scheduled while the split kernel drains and wait in the kernel's own `griddepcontrol_wait`
until the partials are complete and visible (upstream's combine has that wait; the split kernel triggers it with
`griddepcontrol_launch_dependents`). Only the launch changes; `_compile_fwd_combine` is rewritten to build
`PdlForwardCombine`, in a compile cache of its own. Paged KV (page_table, issue 71): upstream's SM120 selection is
handed no page size (b40's validate_fwd_config refuses pages on SM120); the page size reaches the kernel class as the
constructor knob `page_size` (one error, kernel_paged, for a class that does not declare the feature "paged") and
joins our key in the compile key.
"""

from __future__ import annotations

import inspect
import threading
from dataclasses import dataclass, fields, replace
from typing import Callable

from fa4tune import emulated_occupancy
from fa4tune.config import BackwardConfig, ConfigError, Problem
from fa4tune.upstream import BWD_FIELD_NAMES, PINNED_VERSION, SM120_FWD_KNOBS
from fa4tune.kernel_cache import CompileCache, new_cache  # in memory, or on disk under FA4TUNE_KERNEL_CACHE

PINNED_FLASH_ATTN_VERSION = PINNED_VERSION
SM120_ARCH = 120
MAX_SPLITS = 256  # upstream's combine kernel (interface._flash_attn_fwd_combine asserts num_splits <= 256)
TORCH_DTYPE_NAMES = {"torch.bfloat16": "bf16", "torch.float16": "fp16"}


class UpstreamMismatch(RuntimeError):
    """The installed flash-attn-4 does not have the code these edits were written for."""


def _replace_once(src: str, old: str, new: str, what: str) -> str:
    count = src.count(old)
    if count != 1:
        from importlib.metadata import version

        raise UpstreamMismatch(
            f"cannot patch {what}: expected the text once, found it {count} times in flash-attn-4 "
            f"{version('flash-attn-4')} (written for {PINNED_FLASH_ATTN_VERSION})"
        )
    return src.replace(old, new)


def fwd_constructor(cls: str, num_stages: str, num_threads: str, Q_in_regs: str, extra: str = "") -> str:
    """The source of _flash_attn_fwd's SM120 constructor call, with these expressions for the class and three knobs
    (and `extra`, a mapping expression of more keyword arguments, when given)."""
    return (
        f"            fa_fwd = {cls}(\n"
        "                dtype,\n                head_dim,\n                head_dim_v,\n                qhead_per_kvhead,\n"
        "                is_causal=causal,\n                is_local=local,\n                pack_gqa=config.pack_gqa,\n"
        "                tile_m=config.tile_m,\n                tile_n=config.tile_n,\n"
        f"                num_stages={num_stages},\n                num_threads={num_threads},\n"
        f"                Q_in_regs={Q_in_regs},\n"
        + (f"                **{extra},\n" if extra else "")
    )


# as the pinned version has it
UPSTREAM_FWD_CONSTRUCTOR = fwd_constructor("FlashAttentionForwardSm120", *(repr(SM120_FWD_KNOBS[name]) for name in
                                                                        ("num_stages", "num_threads", "Q_in_regs")))


# The forward: upstream selects a FwdConfig (its SM120 tile, or ours through tile_mn) and validates it; the split
# count, threads, stages and Q_in_regs then come from our config (its validation allows SM120 one split only).
FORWARD_EDITS = [
    (
        "    config: FwdConfig | MlaFwdConfig | None = None,\n) -> Tuple[",
        "    config: FwdConfig | MlaFwdConfig | None = None,\n    sm120_config=None,\n) -> Tuple[",
        "forward signature",
    ),
    (
        "    num_splits = config.num_splits\n",
        "    config = _fa4tune_fwd_config(sm120_config, config, batch_size, host_max_seqlen_q, host_max_seqlen_k, num_head,\n"
        "                                 num_head_kv, head_dim, head_dim_v, causal, q_dtype, num_sms)\n"
        "    num_splits = config.num_splits\n",
        "forward num_splits",
    ),
    (
        "        page_size=page_size, block_sparse_tensors=block_sparse_tensors,\n",
        "        page_size=None, block_sparse_tensors=block_sparse_tensors,  # our kernel class takes the pages\n",
        "forward paged KV selection",
    ),
    (
        "    compile_key = (\n        # use_dynamic_varlen only decides",
        "    compile_key = (\n        _fa4tune_key(sm120_config, page_size),\n        # use_dynamic_varlen only decides",
        "forward compile key",
    ),
    (
        UPSTREAM_FWD_CONSTRUCTOR,
        fwd_constructor("_fa4tune_class(sm120_config)", "sm120_config.num_stages", "sm120_config.num_threads",
                        "sm120_config.Q_in_regs", "_fa4tune_knobs(sm120_config, page_size)"),
        "forward SM120 constructor",
    ),
]

# The backward: upstream's one SM120 BwdConfig (its validation refuses any other) becomes ours after validation.
BACKWARD_EDITS = [
    (
        "    config: BwdConfig | None = None,\n) -> Tuple[torch.Tensor, ...]:",
        "    config: BwdConfig | None = None,\n    sm120_config=None,\n    sm120_preprocess_threads=256,\n"
        ") -> Tuple[torch.Tensor, ...]:",
        "backward signature",
    ),
    (
        "        validate_bwd_config(config, inputs)\n    tile_m, tile_n = config.tile_m, config.tile_n\n",
        "        validate_bwd_config(config, inputs)\n    config = _fa4tune_bwd_config(sm120_config, config)\n"
        "    tile_m, tile_n = config.tile_m, config.tile_n\n",
        "backward SM120 knobs",
    ),
    (
        "        fake_mode=fake_mode,\n        hdim_multiple_of=hdim_multiple_of,\n    )\n    # Backward kernel: compute dk",
        "        fake_mode=fake_mode,\n        hdim_multiple_of=hdim_multiple_of,\n        num_threads=sm120_preprocess_threads,\n"
        "    )\n    # Backward kernel: compute dk",
        "backward preprocess threads",
    ),
    (
        "    compile_key = (\n        arch,\n        dtype,\n        head_dim,\n        head_dim_v,\n        qhead_per_kvhead,\n",
        "    compile_key = (\n        _fa4tune_key(sm120_config),\n        arch,\n        dtype,\n        head_dim,\n        head_dim_v,\n"
        "        qhead_per_kvhead,\n",
        "backward compile key",
    ),
    (
        "            flash_bwd_obj_cls = FlashAttentionBackwardSm120 if arch // 10 == 12 else FlashAttentionBackwardSm80",
        "            flash_bwd_obj_cls = _fa4tune_class(sm120_config) if arch // 10 == 12 else FlashAttentionBackwardSm80",
        "backward SM120 class",
    ),
    (
        "                V_in_regs=config.V_in_regs,\n                score_mod=score_mod,\n                score_mod_bwd=score_mod_bwd,\n"
        "            )\n        elif arch // 10 == 9:",
        "                V_in_regs=config.V_in_regs,\n                score_mod=score_mod,\n                score_mod_bwd=score_mod_bwd,\n"
        "                **(sm120_config.extra_knobs if arch // 10 == 12 else {}),\n            )\n        elif arch // 10 == 9:",
        "backward SM120 class's own knobs",
    ),
    (
        '        assert arch // 10 in [9, 10, 11], "Learnable sink backward is supported on SM90 and SM100/SM110"\n',
        "        pass  # SM120: the sink is in the forward's LSE; the dQ postprocess reduces d(sink), as on SM90\n",
        "backward learnable sink",
    ),
    (
        "            utils.convert_from_dlpack_leading_static(t.detach(), leading_dim=3, alignment=4, stride_order=t.dim_order())\n",
        "            to_cute_tensor(t, assumed_align=4, leading_dim=3)  # as the other scratch tensors: fake-compilable\n",
        "backward deterministic counters",
    ),
    (
        '        assert deterministic is False, "deterministic backward not supported on SM 12.0"\n',
        "        _fa4tune_check_deterministic(sm120_config, deterministic)\n",
        "backward deterministic",
    ),
    (
        "    else:\n        num_threads_post_dQ = 128\n        num_threads_post_dKV = 128\n",
        "    else:\n        # the postprocess must read dQ/dK/dV accumulators in the main kernel's MMA layout\n"
        "        num_threads_post_dQ = config.num_threads\n        num_threads_post_dKV = config.num_threads\n",
        "backward postprocess threads",
    ),
]

def sm120_bwd_config(config: BackwardConfig, upstream):
    """Upstream's SM120 BwdConfig with our config's knobs (all but kernel and extra, which reach the class)."""
    return replace(upstream, **{BWD_FIELD_NAMES.get(f.name, f.name): getattr(config, f.name)
                                for f in fields(BackwardConfig) if f.name not in ("kernel", "extra")})


# The backward preprocess (dPsum = rowsum(O * dO), LSE * log2 e, dQaccum zeroed): upstream builds it with its
# default of 256 threads and keeps the count out of the compile key. Its thread count becomes a knob
# (experiment.py's BACKWARD_PREPROCESS_THREADS), in the key.
PREPROCESS_EDITS = [
    (
        "    o_lo=None,\n    *,\n    fake_mode,\n):",
        "    o_lo=None,\n    num_threads=256,\n    *,\n    fake_mode,\n):",
        "preprocess signature",
    ),
    (
        "        o_lo is not None,\n    )\n    if compile_key not in _bwd_preprocess.compile_cache:",
        "        o_lo is not None,\n        num_threads,\n    )\n    if compile_key not in _bwd_preprocess.compile_cache:",
        "preprocess compile key",
    ),
]
COMPILE_PREPROCESS_EDITS = [
    (
        "    has_o_lo=False,\n):",
        "    has_o_lo=False,\n    num_threads=256,\n):",
        "preprocess compile signature",
    ),
    (
        "        hdim_multiple_of=hdim_multiple_of,\n    )\n    return cute.compile(\n        fa_bwd_pre,",
        "        hdim_multiple_of=hdim_multiple_of,\n        num_threads=num_threads,\n    )\n    return cute.compile(\n        fa_bwd_pre,",
        "preprocess constructor",
    ),
]


# PDL needs sm_90 or newer, as upstream's combine does anyway (its griddepcontrol_wait is unconditional); SM120 and
# the H200 have it. A module switch, so that a bench can time both launches.
COMBINE_PDL = True
COMBINE_COMPILE_EDITS = [
    (
        "    fa_combine = FlashAttentionForwardCombine(\n",
        "    fa_combine = _fa4tune_combine_class(\n",
        "combine class",
    ),
]


def pdl_combine_class() -> type:
    """Upstream's FlashAttentionForwardCombine whose kernel launches with use_pdl=True (nothing else differs)."""
    from functools import partial

    from flash_attn.cute.flash_fwd_combine import FlashAttentionForwardCombine

    class PdlForwardCombine(FlashAttentionForwardCombine):
        def kernel(self, *args, **kwargs):
            launcher = FlashAttentionForwardCombine.kernel(self, *args, **kwargs)
            launcher.launch = partial(launcher.launch, use_pdl=True)
            return launcher

    return PdlForwardCombine


def local_num_sms(device_index, arch) -> int:
    """FLASH_ATTENTION_NUM_SMS where set (a cross-compile names its target's), else the local GPU's SM count."""
    import os

    import torch

    override = os.environ.get("FLASH_ATTENTION_NUM_SMS")
    if override is not None:
        return int(override)
    return torch.cuda.get_device_properties(device_index or 0).multi_processor_count


# Each rewritten host function of flash_attn.cute.interface and its edits.
EDITED = (("_flash_attn_fwd", FORWARD_EDITS), ("_compile_fwd_combine", COMBINE_COMPILE_EDITS),
          ("_compile_bwd_preprocess", COMPILE_PREPROCESS_EDITS), ("_bwd_preprocess", PREPROCESS_EDITS),
          ("_flash_attn_bwd", BACKWARD_EDITS))


def edit_problems() -> dict[str, str]:
    """Each edit that does not match the installed interface.py exactly once: its name -> the one-line reason."""
    from flash_attn.cute import interface

    problems = {}
    for name, edits in EDITED:
        src = inspect.getsource(getattr(interface, name))
        for old, new, what in edits:
            try:
                src = _replace_once(src, old, new, what)
            except UpstreamMismatch as err:
                problems[what] = str(err)
    return problems


@dataclass
class PatchedInterface:
    """The two rewritten host functions and their compile caches."""

    flash_attn_fwd: Callable
    flash_attn_bwd: Callable
    fwd_cache: CompileCache
    bwd_cache: CompileCache
    combine_caches: tuple = ()  # the PDL combine's, then upstream's (COMBINE_PDL off)


def _rewrite(namespace: dict, function, edits) -> Callable:
    src = inspect.getsource(function)
    for old, new, what in edits:
        src = _replace_once(src, old, new, what)
    code = compile(src, f"<fa4tune-patched {function.__module__}.{function.__name__}>", "exec")
    exec(code, namespace)
    return namespace[function.__name__]


_LOCK = threading.Lock()
_BUILT: dict[int, PatchedInterface] = {}


def build(class_for: Callable[[object], type]) -> PatchedInterface:
    """Patched fwd/bwd host functions; `class_for(config)` returns the kernel class for a config."""
    with _LOCK:
        cached = _BUILT.get(id(class_for))
        if cached is not None:
            return cached
        from flash_attn.cute import interface

        from fa4tune.targets import get_target

        emulated_occupancy.install(get_target().smem_per_sm)  # under emulation: the target's CTAs per SM

        def key(config, page_size=None):
            if config is None:
                raise ValueError("the fa4tune host path needs an sm120_config")
            cls = class_for(config)
            return (config.key(), f"{cls.__module__}.{cls.__qualname__}", page_size)

        def knobs(config, page_size):
            # a paged call's page size reaches the kernel class as a constructor knob (it picks the gather)
            if page_size is None:
                return config.extra_knobs
            from fa4tune.kernel_class import runs_features

            cls = class_for(config)
            if "paged" not in runs_features(cls):
                raise ConfigError("kernel_paged", f"kernel {config.kernel!r} ({cls.__name__}) does not run paged KV "
                                                  "(only a class that declares 'paged' in its features does)")
            return {**config.extra_knobs, "page_size": page_size}

        def fwd_config(config, upstream, batch, seqlen_q, seqlen_k, num_heads, num_heads_kv, head_dim, head_dim_v, causal,
                       dtype, num_sms):
            problem = Problem(batch, seqlen_q, seqlen_k, num_heads, num_heads_kv, head_dim, head_dim_v, causal,
                              TORCH_DTYPE_NAMES.get(str(dtype), "bf16"), backward=False)
            splits = class_for(config).num_splits_for(config, problem, num_sms)
            if not 1 <= splits <= MAX_SPLITS:
                raise ValueError(f"num_splits_domain: {class_for(config).__name__}.num_splits_for gave {splits} splits, "
                                 f"the combine kernel takes 1 to {MAX_SPLITS}")
            if (upstream.tile_m, upstream.tile_n) != (config.tile_m, config.tile_n):
                raise UpstreamMismatch(f"upstream chose tile {upstream.tile_m}x{upstream.tile_n} for tile_mn="
                                       f"({config.tile_m}, {config.tile_n}): tile_mn no longer reaches the SM120 config")
            return replace(upstream, num_splits=splits)

        def check_deterministic(config, deterministic):
            knob = bool(config is not None and config.extra_knobs.get("deterministic", False))
            if knob != bool(deterministic):
                raise ValueError(f"deterministic_knob: the host's deterministic={deterministic} and the backward "
                                 f"config's deterministic={knob} must agree (the kernel orders dQ with the host's counters)")

        def bwd_config(config, upstream):
            if config is None:
                raise ValueError("the fa4tune host path needs an sm120_config")
            return sm120_bwd_config(config, upstream)

        namespace = dict(vars(interface))
        namespace["_fa4tune_key"] = key
        namespace["_fa4tune_knobs"] = knobs
        namespace["_fa4tune_class"] = class_for
        namespace["_fa4tune_fwd_config"] = fwd_config
        namespace["_fa4tune_bwd_config"] = bwd_config
        namespace["_fa4tune_check_deterministic"] = check_deterministic

        # Always the SM120 classes, on any GPU (native on SM120, emulated elsewhere).
        namespace["_get_device_arch"] = lambda: SM120_ARCH
        namespace["get_num_sms_for_selection"] = local_num_sms  # emulated: the local GPU's SMs, not an SM120's
        fwd = _rewrite(namespace, interface._flash_attn_fwd, FORWARD_EDITS)
        namespace["_fa4tune_combine_class"] = pdl_combine_class()
        _rewrite(namespace, interface._compile_fwd_combine, COMBINE_COMPILE_EDITS)
        pdl_combine = _rewrite(namespace, interface._flash_attn_fwd_combine, [])  # its _compile_fwd_combine is ours
        plain_combine = interface._flash_attn_fwd_combine

        def combine(*args, **kwargs):
            return (pdl_combine if COMBINE_PDL else plain_combine)(*args, **kwargs)

        from flash_attn.cute.cache_utils import JITCache

        # the rewritten function finds its cache under its global name, i.e. here; in memory, ours alone (upstream's
        # may persist under a fingerprint of its own sources only)
        combine.compile_cache = JITCache()
        namespace["_flash_attn_fwd_combine"] = combine
        _rewrite(namespace, interface._compile_bwd_preprocess, COMPILE_PREPROCESS_EDITS)
        preprocess = _rewrite(namespace, interface._bwd_preprocess, PREPROCESS_EDITS)
        preprocess.compile_cache = interface._bwd_preprocess.compile_cache  # upstream's; our keys are one longer
        bwd = _rewrite(namespace, interface._flash_attn_bwd, BACKWARD_EDITS)
        fwd.compile_cache, bwd.compile_cache = new_cache(class_for), new_cache(class_for)
        built = PatchedInterface(fwd, bwd, fwd.compile_cache, bwd.compile_cache,
                                 (combine.compile_cache, plain_combine.compile_cache))
        _BUILT[id(class_for)] = built
        return built
