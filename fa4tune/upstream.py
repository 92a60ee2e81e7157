"""Everything fa4-tune takes from flash-attn-4, named in one place, and the check that a release still has it.

`SYMBOLS` maps each upstream name our code imports, reaches as `module.name`, subclasses or overrides to the
parameter names of its signature in the pinned release (None for a non-callable). `uses()` reads our sources
(AST, nothing imported) for what they take from `flash_attn`; `problems()` resolves each name in the installed
release and returns one line per symbol that moved, vanished or changed its parameters. A re-pin starts with
`uv run pytest tests/test_upstream.py`: a moved symbol fails one named test there instead of a kernel compile.
The host-path text edits are checked the same way (fa4tune.sm120_interface.edit_problems).

`config_module()` loads the pinned release's flash_attn/cute/config.py alone (it imports only the standard
library), so upstream's SM120 defaults are read from its own code without importing torch or the CuTe DSL.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import sys
from functools import lru_cache
from pathlib import Path

PINNED_VERSION = "4.0.0b40"
ROOT = Path(__file__).resolve().parent.parent
SOURCE_DIRS = ("fa4tune", "kernels", "search", "bench")
SOURCE_FILES = ("experiment.py", "prepare.py")
# Reached by name rather than by an import our sources show: upstream's SM120 defaults (fa4tune.defaults reads them
# through config_module()) and the host function our patched interface replaces (fa4tune.sm120_interface).
NAMED = ("flash_attn.cute.config:FwdHeuristicInputs", "flash_attn.cute.config:select_initial_fwd_tile",
         "flash_attn.cute.config:BwdHeuristicInputs", "flash_attn.cute.config:sm120_bwd_fields",
         "flash_attn.cute.config:BwdConfig", "flash_attn.cute.interface:get_num_sms_for_selection")

SM120_ARCH = 120
# What the pinned interface.py passes FlashAttentionForwardSm120 besides the tile (fa4tune.sm120_interface's
# "forward SM120 constructor" edit matches this text, so a release that changes them fails that edit).
SM120_FWD_KNOBS = {"num_stages": 1, "num_threads": 128, "Q_in_regs": False}
# Our BackwardConfig's names for upstream's BwdConfig fields where they differ.
BWD_FIELD_NAMES = {"m_block_size": "tile_m", "n_block_size": "tile_n"}

# module:qualname -> parameter names in PINNED_VERSION (None: not a callable). Regenerate the values with
# `python -m fa4tune.upstream --record` after reading what changed.
SYMBOLS: dict[str, tuple | None] = {
    'flash_attn.cute.ampere_helpers:gemm': ('tiled_mma', 'acc', 'tCrA', 'tCrB', 'tCsA', 'tCsB', 'smem_thr_copy_A',
        'smem_thr_copy_B', 'hook_fn', 'A_in_regs', 'B_in_regs', 'swap_AB'),
    'flash_attn.cute.ampere_helpers:gemm_rs': ('tiled_mma', 'acc', 'tCrA', 'tCrB', 'tCsB', 'smem_thr_copy_B',
        'hook_fn'),
    'flash_attn.cute.ampere_helpers:get_smem_layout_atom': ('dtype', 'k_dim'),
    'flash_attn.cute.autotune:_measure_configs': ('configs', 'forward_kwargs'),
    'flash_attn.cute.autotune:_normalize_kwargs': ('forward_kwargs',),
    'flash_attn.cute.autotune:tune_fwd_config': ('configs', 'forward_kwargs', 'compile_workers'),
    'flash_attn.cute.barrier:arrive_inc': ('lock_ptr', 'thread_idx', 'flag_offset', 'val'),
    'flash_attn.cute.barrier:wait_eq': ('lock_ptr', 'thread_idx', 'flag_offset', 'val'),
    'flash_attn.cute.block_info:BlockInfo': ('self', 'tile_m', 'tile_n', 'is_causal', 'is_local', 'is_split_kv',
        'window_size_left', 'window_size_right', 'qhead_per_kvhead_packgqa', 'num_splits', 'pack_split_idx',
        'num_n_blocks_per_split'),
    'flash_attn.cute.block_sparsity:BlockSparseTensors': ('mask_block_cnt', 'mask_block_idx', 'full_block_cnt',
        'full_block_idx', 'cu_total_m_blocks', 'cu_block_idx_offsets', 'dq_write_order', 'dq_write_order_full'),
    'flash_attn.cute.cache_utils:CUTE_DSL_CACHE_ENABLED': None,
    'flash_attn.cute.cache_utils:JITCache': ('self',),
    'flash_attn.cute.config:BwdConfig': ('self', 'device_capacity', 'tile_m', 'tile_n', 'num_stages_Q',
        'num_stages_dO', 'num_stages_PdS', 'SdP_swapAB', 'dKV_swapAB', 'dQ_swapAB', 'AtomLayoutMSdP',
        'AtomLayoutNdKV', 'AtomLayoutMdQ', 'num_threads', 'dQ_single_wg', 'V_in_regs', 'use_2cta_instrs',
        'cluster_size', 'spt', 'pack_factor', 'head_loop', 'fold_LSE_dPsum', 'registers'),
    'flash_attn.cute.config:BwdHeuristicInputs': ('device_arch', 'head_dim', 'head_dim_v', 'num_heads',
        'num_heads_kv', 'dtype', 'num_sms', 'batch_size', 'max_seqlen_q', 'max_seqlen_k', 'total_q', 'total_k',
        'has_cu_seqlens', 'causal', 'local', 'deterministic', 'use_block_sparsity', 'sparse_block_size_q',
        'sparse_block_size_kv', 'sparse_spt', 'has_score_mod', 'has_score_mod_bwd', 'has_softcap',
        'zero_softmax_scale', 'has_mask_mod', 'has_learnable_sink', 'requested_V_in_regs', 'requested_tile_n',
        'requested_pack_gqa', 'requested_head_loop', 'disable_2cta'),
    'flash_attn.cute.config:FwdConfig': ('self', 'device_capacity', 'tile_m', 'tile_n', 'mma_pv_is_rs',
        'intra_wg_overlap', 'q_stage', 'pack_gqa', 'use_clc_scheduler', 'is_static_persistent', 'use_tma_o',
        'use_s_ping_pong', 'num_splits', 'use_2cta_instrs', 'registers', 'ex2_emu_freq', 'ex2_emu_start_frg',
        'overlap_sO_sQ', 'kv_stage', 'sm_stats_cross_stage', 'use_swapab', 'use_dynamic_varlen', 'lpt_global'),
    'flash_attn.cute.config:FwdHeuristicInputs': ('device_arch', 'num_sms', 'dtype', 'head_dim', 'head_dim_v',
        'num_heads', 'num_heads_kv', 'batch_size', 'total_q', 'total_k', 'max_seqlen_q', 'max_seqlen_k',
        'has_max_seqlen_q_hint', 'seqlen_k_per_split', 'causal', 'local', 'window_size_left', 'window_size_right',
        'has_cu_seqlens_q', 'has_cu_seqlens_k', 'has_seqused_q', 'has_seqused_k', 'has_caller_scheduler_metadata',
        'has_tile_count_semaphore', 'pack_gqa', 'page_size', 'use_block_sparsity', 'sparse_mask_per_head',
        'sparse_q_block_size', 'sparse_kv_block_size', 'has_score_mod', 'has_mask_mod', 'has_learnable_sink',
        'has_lse', 'requested_tile_m', 'requested_tile_n', 'requested_mma_pv_is_rs', 'requested_intra_wg_overlap',
        'requested_num_splits', 'disable_2cta', 'disable_s_ping_pong', 'disable_scheduler_metadata',
        'requested_use_swapab', 'seqlen_k_capacity', 'requires_grad', 'has_aux_scalars', 'mxfp8_path'),
    'flash_attn.cute.config:select_initial_fwd_tile': ('inputs',),
    'flash_attn.cute.config:sm120_bwd_fields': ('inputs',),
    'flash_attn.cute.cute_dsl_utils:assume_tensor_aligned': ('t', 'canonicalize_singletons', 'align_bits'),
    'flash_attn.cute.cute_dsl_utils:to_cute_tensor': ('t', 'assumed_align', 'leading_dim', 'fully_dynamic',
        'enable_tvm_ffi'),
    'flash_attn.cute.flash_bwd:FlashAttentionBackwardSm80.compute_one_m_block': ('self', 'm_block',
        'smem_pipe_read_q', 'smem_pipe_read_do', 'smem_pipe_write_q', 'smem_pipe_write_do', 'mma_params',
        'smem_copy_params', 'gmem_copy_params', 'load_Q_LSE', 'load_dO_dPsum', 'm_block_max', 'softmax_scale',
        'softmax_scale_log2', 'aux_data', 'mask_fn'),
    'flash_attn.cute.flash_bwd:FlashAttentionBackwardSm80.epilogue': ('self', 'acc_dK', 'acc_dV', 'mdK', 'mdV',
        'sdK', 'sdV', 'gmem_tiled_copy_dK', 'gmem_tiled_copy_dV', 'tiled_mma', 'tidx', 'n_block', 'num_head',
        'batch_size', 'seqlen', 'd_head', 'd_head_v'),
    'flash_attn.cute.flash_bwd:sm80_utils': None,
    'flash_attn.cute.flash_bwd_sm120:FlashAttentionBackwardSm120': ('self', 'dtype', 'head_dim', 'head_dim_v',
        'qhead_per_kvhead', 'm_block_size', 'n_block_size', 'num_stages_Q', 'num_stages_dO', 'num_threads',
        'pack_gqa', 'is_causal', 'is_local', 'SdP_swapAB', 'dKV_swapAB', 'dQ_swapAB', 'AtomLayoutMSdP',
        'AtomLayoutNdKV', 'AtomLayoutMdQ', 'V_in_regs', 'score_mod', 'score_mod_bwd'),
    'flash_attn.cute.flash_fwd:FlashAttentionForwardBase._check_type': ('self', 'mQ_type', 'mK_type', 'mV_type',
        'mO_type', 'mLSE_type', 'mCuSeqlensQ_type', 'mCuSeqlensK_type', 'mSeqUsedQ_type', 'mSeqUsedK_type'),
    'flash_attn.cute.flash_fwd:FlashAttentionForwardBase._get_shared_storage_cls': ('self',),
    'flash_attn.cute.flash_fwd:FlashAttentionForwardBase._get_smem_layout_atom': ('self',),
    'flash_attn.cute.flash_fwd:FlashAttentionForwardBase._get_tiled_mma': ('self',),
    'flash_attn.cute.flash_fwd:FlashAttentionForwardBase._setup_attributes': ('self',),
    'flash_attn.cute.flash_fwd:FlashAttentionForwardBase.epilogue': ('self', 'acc_O', 'lse', 'mO', 'mLSE', 'sO',
        'seqlen', 'gmem_tiled_copy_O', 'tma_atom_O', 'tiled_mma', 'tidx', 'm_block', 'head_idx', 'batch_idx'),
    'flash_attn.cute.flash_fwd:FlashAttentionForwardSm80._get_shared_storage_cls': ('self',),
    'flash_attn.cute.flash_fwd:FlashAttentionForwardSm80._get_smem_layout_atom': ('self',),
    'flash_attn.cute.flash_fwd:FlashAttentionForwardSm80._get_tiled_mma': ('self',),
    'flash_attn.cute.flash_fwd:FlashAttentionForwardSm80.compute_one_n_block': ('self', 'n_block', 'smem_pipe_read',
        'smem_pipe_write', 'mma_params', 'smem_copy_params', 'softmax', 'load_K', 'load_V', 'score_mod',
        'batch_idx', 'head_idx', 'm_block', 'seqlen', 'aux_data', 'fastdiv_mods', 'mask_fn', 'is_first_n_block',
        'check_inf'),
    'flash_attn.cute.flash_fwd:FlashAttentionForwardSm80.kernel': ('self', 'mQ', 'mK', 'mV', 'mO', 'mLSE',
        'mCuSeqlensQ', 'mCuSeqlensK', 'mSeqUsedQ', 'mSeqUsedK', 'softmax_scale_log2', 'softmax_scale',
        'window_size_left', 'window_size_right', 'sQ_layout', 'sK_layout', 'sV_layout', 'sO_layout', 'sP_layout',
        'gmem_tiled_copy_Q', 'gmem_tiled_copy_K', 'gmem_tiled_copy_V', 'gmem_tiled_copy_O', 'tiled_mma_qk',
        'tiled_mma_pv', 'SharedStorage', 'tile_sched_params', 'TileScheduler', 'aux_data', 'fastdiv_mods'),
    'flash_attn.cute.flash_fwd_combine:FlashAttentionForwardCombine': ('self', 'dtype', 'dtype_partial', 'head_dim',
        'num_head', 'tile_m', 'k_block_size', 'log_max_splits', 'num_threads', 'stages'),
    'flash_attn.cute.flash_fwd_sm120:FlashAttentionForwardSm120': ('self', 'args', 'kwargs'),
    'flash_attn.cute.interface:_bwd_preprocess': ('out', 'dout', 'dpsum', 'lse', 'lse_log2', 'dq_accum',
        'cu_seqlens_q', 'seqused_q', 'dlse', 'dtype', 'head_dim', 'head_dim_v', 'm_block_size', 'row_max',
        'scale_p', 'use_padded_offsets', 'nheads_major', 'pack_gqa', 'qhead_per_kvhead', 'nheads_kv',
        'softmax_scale', 'cu_total_m_blocks', 'hdim_multiple_of', 'o_lo', 'fake_mode'),
    'flash_attn.cute.interface:_compile_bwd_preprocess': ('dtype', 'head_dim', 'head_dim_v', 'm_block_size',
        'has_cuseqlens_q', 'has_seqused_q', 'has_dlse', 'has_dq_accum', 'has_scaleP', 'has_lse_log2',
        'use_padded_offsets', 'nheads_major', 'pack_gqa', 'qhead_per_kvhead', 'nheads_kv', 'has_cu_total_m_blocks',
        'hdim_multiple_of', 'has_o_lo'),
    'flash_attn.cute.interface:_compile_fwd_combine': ('_arch', 'dtype', 'dtype_partial', 'head_dim', 'num_head',
        'tile_m', 'k_block_size', 'log_max_splits', 'has_cu_seqlens', 'has_seqused', 'has_lse',
        'has_virtual_batch_idx', 'has_num_splits_dynamic', 'has_semaphore_to_reset'),
    'flash_attn.cute.interface:_flash_attn_bwd': ('q', 'k', 'v', 'out', 'dout', 'lse', 'softmax_scale', 'causal',
        'softcap', 'window_size_left', 'window_size_right', 'm_block_size', 'n_block_size', 'num_threads',
        'pack_gqa', 'num_stages_Q', 'num_stages_dO', 'SdP_swapAB', 'dKV_swapAB', 'dQ_swapAB', 'AtomLayoutMSdP',
        'AtomLayoutNdKV', 'AtomLayoutMdQ', 'V_in_regs', 'cu_seqlens_q', 'cu_seqlens_k', 'seqused_q', 'seqused_k',
        'max_seqlen_q', 'max_seqlen_k', 'deterministic', 'dq', 'dk', 'dv', 'score_mod', 'score_mod_bwd', 'mask_mod',
        'aux_tensors', 'aux_scalars', 'block_sparse_tensors', 'dlse', 'learnable_sink', 'config'),
    'flash_attn.cute.interface:_flash_attn_fwd': ('q', 'k', 'v', 'qv', 'cu_seqlens_q', 'cu_seqlens_k', 'seqused_q',
        'seqused_k', 'max_seqlen_q', 'max_seqlen_k', 'min_seqlen_k', 'page_table', 'softmax_scale', 'causal',
        'softcap', 'window_size_left', 'window_size_right', 'learnable_sink', 'tile_mn', 'mma_pv_is_rs',
        'intra_wg_overlap', 'num_splits', 'pack_gqa', '_arch', 'score_mod', 'mask_mod', 'block_sparse_tensors',
        'return_lse', 'out', 'lse', 'aux_tensors', 'aux_scalars', 'scales', 'gather_kv_indices',
        'scheduler_metadata', 'seqlen_k_per_split', 'disable_scheduler_metadata', 'gather_bwd_recompute_p',
        'config'),
    'flash_attn.cute.interface:_flash_attn_fwd_combine': ('out_partial', 'lse_partial', 'out', 'lse', 'cu_seqlens',
        'seqused', 'num_splits_dynamic_ptr', 'virtual_batch_idx', 'semaphore_to_reset', '_arch'),
    'flash_attn.cute.interface:flash_attn_func': ('q', 'k', 'v', 'qv', 'gather_kv_indices', 'softmax_scale',
        'causal', 'window_size', 'learnable_sink', 'softcap', 'num_splits', 'pack_gqa', 'deterministic',
        'score_mod', 'score_mod_bwd', 'mask_mod', 'aux_tensors', 'aux_scalars', 'block_sparse_tensors',
        'block_sparse_tensors_bwd', 'return_lse', 'gather_bwd_recompute_p', 'gather_bwd_token_chunk', 'config',
        'scales'),
    'flash_attn.cute.interface:flash_attn_varlen_func': ('q', 'k', 'v', 'qv', 'cu_seqlens_q', 'cu_seqlens_k',
        'max_seqlen_q', 'max_seqlen_k', 'min_seqlen_k', 'seqused_q', 'seqused_k', 'gather_kv_indices', 'page_table',
        'softmax_scale', 'causal', 'window_size', 'learnable_sink', 'softcap', 'num_splits', 'pack_gqa',
        'deterministic', 'score_mod', 'score_mod_bwd', 'mask_mod', 'block_sparse_tensors', 'aux_tensors',
        'aux_scalars', 'return_lse', 'scheduler_metadata', 'seqlen_k_per_split', 'disable_scheduler_metadata',
        'gather_bwd_recompute_p', 'gather_bwd_token_chunk', 'config', 'scales'),
    'flash_attn.cute.interface:get_num_sms_for_selection': ('device_index', 'arch'),
    'flash_attn.cute.mask:AttentionMask': ('self', 'tile_m', 'tile_n', 'seqlen_info', 'window_size_left',
        'window_size_right', 'qhead_per_kvhead_packgqa', 'swap_AB'),
    'flash_attn.cute.pack_gqa:PackGQA': ('self', 'm_block_size', 'head_dim_padded', 'check_hdim_oob',
        'qhead_per_kvhead'),
    'flash_attn.cute.pack_gqa:make_packgqa_tiled_tma_atom': ('op', 'gmem_tensor', 'smem_layout', 'cta_tiler',
        'qhead_per_kvhead', 'head_idx'),
    'flash_attn.cute.pack_gqa:pack_gqa_layout': ('T', 'qhead_per_kvhead', 'nheads_kv', 'head_idx', 'seqlen_idx'),
    'flash_attn.cute.seqlen_info:SeqlenInfoQK': ('self', 'offset_q', 'offset_k', 'padded_offset_q',
        'padded_offset_k', 'seqlen_q', 'seqlen_k', 'm_block_offset', 'block_idx_offset', 'num_n_blocks',
        'has_cu_seqlens_q', 'has_cu_seqlens_k', 'has_seqused_q', 'has_seqused_k', 'has_cu_block_idx_offsets'),
    'flash_attn.cute.softmax:Softmax': ('self', 'scale_log2', 'num_rows', 'row_max', 'row_sum', 'arch',
        'softmax_scale'),
    'flash_attn.cute.testing:is_fake_mode': (),
    'flash_attn.cute.tile_scheduler:SingleTileScheduler': ('self', 'params', 'blk_coord', 'loc', 'ip'),
    'flash_attn.cute.tile_scheduler:SingleTileVarlenScheduler': ('self', 'params', 'tile_idx', 'split_idx', 'ctx',
        'loc', 'ip'),
    'flash_attn.cute.tile_scheduler:TileSchedulerArguments': ('self', 'num_block', 'num_head', 'num_batch',
        'num_splits', 'seqlen_k', 'headdim', 'headdim_v', 'total_q', 'tile_shape_mn', 'cluster_shape_mn',
        'mCuSeqlensQ', 'mSeqUsedQ', 'qhead_per_kvhead_packgqa', 'element_size', 'is_persistent', 'lpt',
        'is_split_kv', 'head_swizzle', 'use_cluster_idx', 'lpt_global', 'num_splits_dynamic_ptr',
        'num_m_blocks_ptr', 'virtual_batch_idx_ptr', 'num_nheads_in_l2_ptr', 'cu_total_m_blocks_ptr',
        'cu_total_splits_m_blocks_ptr', 'blocks_to_batch_idx_ptr', 'tile_count_semaphore',
        'persistent_cta_multiplier', 'split_major', 'qhead_fold'),
    'flash_attn.cute.utils:AuxData': ('tensors', 'scalars'),
    'flash_attn.cute.utils:compute_fastdiv_mods': ('mQ', 'mK', 'qhead_per_kvhead', 'pack_gqa', 'aux_tensors',
        'mPageTable'),
    'flash_attn.cute.utils:compute_softmax_scale_log2': ('softmax_scale', 'score_mod'),
    'flash_attn.cute.utils:elem_pointer': ('x', 'coord', 'loc', 'ip'),
    'flash_attn.cute.utils:make_tiled_copy_A': ('copy_atom', 'tiled_mma', 'swapAB'),
    'flash_attn.cute.utils:make_tiled_copy_B': ('copy_atom', 'tiled_mma', 'swapAB'),
    'flash_attn.cute.utils:predicate_k': ('tAcA', 'limit'),
    'flash_attn.cute.utils:warp_reduce': ('val', 'op', 'width'),
}


def _parameters(obj) -> tuple | None:
    if inspect.ismodule(obj) or not callable(obj):
        return None
    if inspect.isclass(obj) and hasattr(obj, "_fields"):  # a NamedTuple: its fields are its parameters
        return tuple(obj._fields)
    target = obj.__init__ if inspect.isclass(obj) else obj
    try:
        return tuple(inspect.signature(target).parameters)
    except (TypeError, ValueError):
        return None


def resolve(symbol: str):
    """The object `module:qualname` names in the installed flash-attn-4 (ImportError/AttributeError if gone)."""
    module, _, qualname = symbol.partition(":")
    obj = importlib.import_module(module)
    for part in filter(None, qualname.split(".")):
        obj = getattr(obj, part)
    return obj


def _python_files():
    for name in SOURCE_FILES:
        yield ROOT / name
    for folder in SOURCE_DIRS:
        yield from sorted((ROOT / folder).rglob("*.py"))


def uses() -> dict[str, set[str]]:
    """module:qualname -> our files that take it: `from flash_attn... import X`, `alias.X` of an imported upstream
    module, and the methods our subclasses of an upstream class override (resolved when `problems` runs)."""
    found: dict[str, set[str]] = {name: {"fa4tune/upstream.py NAMED"} for name in NAMED}
    for path in _python_files():
        tree = ast.parse(path.read_text(), str(path))
        where = str(path.relative_to(ROOT))
        aliases: dict[str, str] = {}  # local name -> upstream module
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("flash_attn"):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    if importlib.util.find_spec(node.module) and _is_module(full):
                        aliases[alias.asname or alias.name] = full
                    else:
                        found.setdefault(f"{node.module}:{alias.name}", set()).add(where)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("flash_attn.") and alias.asname:
                        aliases[alias.asname] = alias.name
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                found.setdefault(f"{aliases[node.value.id]}:{node.attr}", set()).add(where)
    return found


@lru_cache(maxsize=None)
def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def overridden() -> dict[str, set[str]]:
    """Upstream methods that our kernel classes (kernels/, experiment.py's) override: module:Class.method."""
    from fa4tune import kernel_class

    found: dict[str, set[str]] = {}
    for cls in [*kernel_class.forward_kernels().values(), *kernel_class.backward_kernels().values()]:
        for base in cls.__mro__[1:]:
            if not base.__module__.startswith("flash_attn."):
                continue
            for klass in cls.__mro__:
                if klass.__module__.startswith("flash_attn."):
                    break
                for name, value in vars(klass).items():
                    if callable(value) and name in vars(base) and not name.startswith("__"):
                        found.setdefault(f"{base.__module__}:{base.__qualname__}.{name}", set()).add(klass.__module__)
    return found


def problems(symbols: dict[str, tuple | None] = SYMBOLS) -> dict[str, str]:
    """symbol -> one line saying how the installed release differs from the pinned one; empty when it matches."""
    out = {}
    for symbol, params in symbols.items():
        try:
            obj = resolve(symbol)
        except (ImportError, AttributeError) as err:
            out[symbol] = f"{symbol}: not in flash-attn-4 {_installed()} ({type(err).__name__}: {err})"
            continue
        now = _parameters(obj)
        if now != params:
            out[symbol] = f"{symbol}: parameters {now} in flash-attn-4 {_installed()}, {params} in {PINNED_VERSION}"
    return out


def _installed() -> str:
    from importlib.metadata import version

    return version("flash-attn-4")


@lru_cache(maxsize=1)
def config_module():
    """The pinned release's flash_attn/cute/config.py, loaded alone (standard library imports only)."""
    spec = importlib.util.find_spec("flash_attn")
    return load_config(Path(next(iter(spec.submodule_search_locations))) / "cute" / "config.py")


def load_config(path: Path, name: str = "fa4tune._upstream_config"):
    """A flash_attn/cute/config.py (the installed one, or a patched copy's) as a module of its own, imported alone."""
    loaded = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(loaded)
    sys.modules[loaded.name] = module  # dataclasses resolve their module by name
    loaded.loader.exec_module(module)
    return module


def sm120_forward_tile(head_dim: int, head_dim_v: int, causal: bool, qhead_per_kvhead: int) -> tuple[int, int]:
    """(tile_m, tile_n) the pinned release's `select_initial_fwd_tile` gives an SM120 forward with no tile asked."""
    config = config_module()
    inputs = config.FwdHeuristicInputs(
        device_arch=SM120_ARCH, num_sms=1, dtype="torch.bfloat16", head_dim=head_dim, head_dim_v=head_dim_v,
        num_heads=qhead_per_kvhead, num_heads_kv=1, batch_size=1, total_q=1, total_k=1, max_seqlen_q=1,
        max_seqlen_k=1, causal=causal)
    tile_m, tile_n, *_ = config.select_initial_fwd_tile(inputs)
    return tile_m, tile_n


def sm120_backward_fields(head_dim: int, head_dim_v: int, causal: bool, qhead_per_kvhead: int) -> dict:
    """The pinned release's one SM120 backward config (`sm120_bwd_fields`), in our BackwardConfig's names."""
    config = config_module()
    inputs = config.BwdHeuristicInputs(device_arch=SM120_ARCH, head_dim=head_dim, head_dim_v=head_dim_v,
                                       num_heads=qhead_per_kvhead, num_heads_kv=1, dtype="torch.bfloat16",
                                       causal=causal)
    upstream = config.sm120_bwd_fields(inputs)
    ours = {upstream_name: name for name, upstream_name in BWD_FIELD_NAMES.items()}
    return {ours.get(name, name): value for name, value in upstream.items()}


def record() -> dict[str, tuple | None]:
    """Every symbol our code uses, with its parameters in the installed release (for a maintainer's re-pin)."""
    names = sorted(set(uses()) | set(overridden()))
    return {name: _parameters(resolve(name)) for name in names}


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        raise SystemExit("usage: python -m fa4tune.upstream --record   (prints SYMBOLS for the installed release)")
    import textwrap

    for name, params in record().items():
        print(textwrap.fill(f"{name!r}: {params!r},", 116, initial_indent="    ", subsequent_indent="        ",
                            break_on_hyphens=False, break_long_words=False))
