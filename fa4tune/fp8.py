"""FP8 (e4m3) inputs for attention, as the SM120 FP8 forward takes them (issue 45): Q and K quantized per tile of
rows with one fp32 scale each (amax / 448), K smoothed first (SageAttention's mean subtraction: arXiv 2410.02367).

Smoothing subtracts each (batch, head, channel)'s mean over the keys from K. Every score of a query row moves by the
same q . mean, so softmax and the output do not change; the LSE moves by softmax_scale * q . mean, which
`lse_correction` gives back (from the unquantized q). It keeps a channel that carries a large offset over all keys
from setting its tiles' scales: on such inputs per-tile e4m3 without it misses the FP8 gate by 2x
(docs/measurements/2026-12-06-fp8-accuracy-gate.md).
"""

from __future__ import annotations

import torch

FP8_MAX = 448.0  # largest finite e4m3 value


def quantize_per_tile(x: torch.Tensor, tile: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x (batch, seqlen, heads, dim) -> (e4m3 values of the same shape, fp32 scales (batch, heads, tiles)):
    x ~= values * scale[b, h, row // tile], each tile of `tile` rows of one head scaled by amax / 448 (1 if all 0)."""
    b, s, h, d = x.shape
    tiles = -(-s // tile)
    padded = torch.nn.functional.pad(x.float(), (0, 0, 0, 0, 0, tiles * tile - s)).view(b, tiles, tile, h, d)
    amax = padded.abs().amax(dim=(2, 4))  # (b, tiles, h)
    # a tensor divisor: on a GPU torch takes x / python_scalar as x * (1 / scalar), a bit off the rounded quotient
    # that the fused kernel (div_rn) and the CPU compute
    scale = torch.where(amax > 0, amax / torch.full_like(amax, FP8_MAX), torch.ones_like(amax))
    values = (padded / scale[:, :, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return values.view(b, tiles * tile, h, d)[:, :s].contiguous(), scale.permute(0, 2, 1).contiguous()


def pv_key_order(tile: int = 32) -> list[int]:
    """FP8 PV (knob pv_fp8 of kernels/fp8_forward_sm120.py): the key each position of a 32-key block of V^T holds,
    so that P's registers as the S MMA leaves them are m16n8k32's e4m3 A fragment without a shuffle: lane t's row
    holds the S columns 8 j + 2 t + c (c in 0, 1) of the block's four n8 tiles j, and A's k = 4 t + i (then
    16 + 4 t + i) takes i = c + 2 (j mod 2) of tiles 0 and 1 (then 2 and 3). A permutation of 0..31."""
    return [8 * ((k % 4) // 2 + 2 * (k // 16)) + 2 * ((k % 16) // 4) + k % 2 for k in range(tile)]


def vt_keys(positions: int, device=None) -> torch.Tensor:
    """The key each of V^T's first `positions` positions holds (pv_key_order within every 32)."""
    block = torch.arange(positions, device=device)
    return block - block % 32 + torch.tensor(pv_key_order(), device=device)[block % 32]


def quantize_v(v: torch.Tensor, tile_n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 PV: v (batch, seqlen_k, kv heads, dim_v) -> (e4m3 V^T (batch, kv heads, dim_v, seqlen_k padded to whole
    tiles with zeros), keys in pv_key_order within each 32; fp32 scales (batch, kv heads, dim_v): amax / 448 per
    channel over the keys, 1 where all 0)."""
    b, s, h, d = v.shape
    amax = v.abs().amax(dim=1).float()
    scale = torch.where(amax > 0, amax / torch.full_like(amax, FP8_MAX), torch.ones_like(amax))  # as above
    padded = -(-s // tile_n) * tile_n
    if _use_fused(v):  # one Triton kernel: scale, order, transpose and cast (fused_quantize_v)
        try:
            return fused_quantize_v(v, scale, padded), scale
        except Exception as err:  # noqa: BLE001 - Triton's compile or launch: the torch path below instead
            _fused_failed(err)
    x = torch.nn.functional.pad((v.float() / scale[:, None]).clamp(-FP8_MAX, FP8_MAX), (0, 0, 0, 0, 0, padded - s))
    x = x[:, vt_keys(padded, v.device)]
    return x.permute(0, 2, 3, 1).contiguous().to(torch.float8_e4m3fn), scale


def dequantize_v(vt: torch.Tensor, scale: torch.Tensor, seqlen_k: int) -> torch.Tensor:
    """quantize_v's inverse, in fp32: (batch, seqlen_k, kv heads, dim_v)."""
    v = torch.empty(vt.shape, device=vt.device, dtype=torch.float32)
    v[..., vt_keys(vt.shape[-1], vt.device)] = vt.float() * scale[..., None]
    return v[..., :seqlen_k].permute(0, 3, 1, 2)


def dequantize_per_tile(values: torch.Tensor, scale: torch.Tensor, tile: int) -> torch.Tensor:
    """quantize_per_tile's inverse, in fp32."""
    rows = scale.permute(0, 2, 1).repeat_interleave(tile, dim=1)[:, : values.shape[1]]  # (b, s, h)
    return values.float() * rows[..., None]


def smooth_k(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(K minus its mean over the keys, in fp32; the mean (batch, heads, dim), fp32) for (batch, seqlen, heads, dim)."""
    mean = k.mean(dim=1, dtype=torch.float32)  # as the fused path takes it (quantize_inputs)
    return k.float() - mean[:, None], mean


def lse_correction(q: torch.Tensor, mean: torch.Tensor, softmax_scale: float) -> torch.Tensor:
    """What smoothing K took off each row's LSE, (batch, heads, seqlen) fp32: softmax_scale * q . mean, GQA by
    repeating the K heads' means."""
    group = q.shape[2] // mean.shape[1]
    return torch.einsum("bshd,bhd->bhs", q.float(), mean.repeat_interleave(group, dim=1)) * softmax_scale


# -- the host path of the FP8 forward (kernels/fp8_forward_sm120.py, kernel "sm120_fp8") ---------------------------

class CompiledKernels(dict):
    """(config, head dims, GQA ratio, causal) -> (compiled function, the kernel object that traced it); each new
    compile is told to `listeners(key, fn)`, as upstream's host caches do (fa4tune.fake_compile reads its facts)."""

    def __init__(self):
        super().__init__()
        self.listeners: list = []


COMPILED = CompiledKernels()


def default_config(head_dim: int):
    """The FP8 forward's default tiles for a head dim (fa4tune.defaults.fp8_forward)."""
    from fa4tune.config import FP8, ProblemClass
    from fa4tune.defaults import fp8_forward

    return fp8_forward(ProblemClass(head_dim, head_dim, False, dtype=FP8))


def check_call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, config, target=None):
    """One ConfigError naming the rule and the value where the FP8 forward cannot run this call; else its problem
    class (the inputs' head dims, mask and GQA ratio, dtype "fp8"; the static rules by the class's shortest problem)."""
    from fa4tune.config import FP8, ConfigError, ProblemClass
    from fa4tune.feasibility import check_forward
    from fa4tune.targets import get_target

    if not all(t.dim() == 4 for t in (q, k, v)):
        raise ConfigError("fp8_shapes", f"q, k, v must be (batch, seqlen, heads, head_dim), got {[tuple(t.shape) for t in (q, k, v)]}")
    if not all(t.dtype == torch.bfloat16 for t in (q, k, v)):
        raise ConfigError("fp8_inputs_bf16", f"the FP8 forward takes bf16 q, k, v (V and O stay bf16), got {[str(t.dtype) for t in (q, k, v)]}")
    if q.shape[2] % k.shape[2] or k.shape[2] != v.shape[2]:
        raise ConfigError("fp8_heads", f"q's heads must be a multiple of k's, v's equal to k's, got {q.shape[2]}, {k.shape[2]}, {v.shape[2]}")
    pc = ProblemClass(q.shape[3], v.shape[3], causal, q.shape[2] // k.shape[2], FP8)
    verdict = check_forward(config, pc, get_target(target))
    if not verdict:
        raise ConfigError(verdict.rule, f"sm120_fp8: {verdict.message}")
    return pc


def pv_fp8(config) -> bool:
    """Whether the config runs P V in e4m3 too (the class's knob pv_fp8)."""
    return bool(config.extra_knobs.get("pv_fp8", False))


def compile_fp8(config, qq, qs, kq, ks, v, out, lse, causal: bool, softmax_scale: float, vt=None, vs=None):
    """The kernel for these (quantized) operands, compiled once per (config, head dims, GQA ratio, causal); returns
    (compiled function, the kernel object that traced it: its `smem_bytes_traced` is the launched struct's size)."""
    import cutlass
    import cutlass.cute as cute
    from cutlass import Float32
    from flash_attn.cute.cute_dsl_utils import to_cute_tensor
    from flash_attn.cute.utils import AuxData

    from fa4tune.kernel_class import forward_kernel

    key = (config, qq.shape[3], v.shape[3], qq.shape[2] // kq.shape[2], causal)
    if key not in COMPILED:
        # the class by the config's name, from the registry (fa4tune/ imports no kernels/ module: fa4tune.import_graph)
        cls = forward_kernel(config.kernel)
        if not getattr(cls, "quantizes", False):
            from fa4tune.config import ConfigError

            raise ConfigError("fp8_kernel", f"the FP8 path runs a kernel class that quantizes (sm120_fp8); "
                              f"kernel {config.kernel!r} does not")
        kernel = cls(cutlass.BFloat16, qq.shape[3], v.shape[3], qq.shape[2] // kq.shape[2], is_causal=causal,
                     pack_gqa=False, tile_m=config.tile_m, tile_n=config.tile_n, num_stages=config.num_stages,
                     num_threads=config.num_threads, pv_fp8=pv_fp8(config))
        tensors = [to_cute_tensor(t) for t in (qq, kq, v, out)]
        scales = [to_cute_tensor(t, assumed_align=4) for t in (qs, ks)]
        # FP8 PV: V^T and its per-channel scales after the Q / K scales (None without pv_fp8)
        scales += [to_cute_tensor(vt), to_cute_tensor(vs, assumed_align=4)] if vt is not None else [None, None]
        # positional, as flash_attn.cute.interface calls the forward: softmax_scale, cu_seqlens q/k, seqused q/k,
        # page_table, window left/right, learnable_sink, block sparsity, aux_data, cu_total_m, cu_total_splits, then ours
        fn = cute.compile(kernel, *tensors, to_cute_tensor(lse, assumed_align=4), Float32(softmax_scale), None, None, None,
                          None, None, None, None, None, None, AuxData(None, None), None, None, *scales,
                          cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")
        COMPILED[key] = (fn, kernel)
        for listener in COMPILED.listeners:
            listener(key, fn)
    return COMPILED[key]


def quantize_inputs(q: torch.Tensor, k: torch.Tensor, config, softmax_scale: float, v: torch.Tensor | None = None) -> tuple:
    """What the FP8 kernel takes, from bf16 q and k: (e4m3 Q, Q's scales, e4m3 smoothed K, K's scales, the LSE
    correction (batch, heads, seqlen_q) that the smoothing needs), and with pv_fp8 V^T and its scales (quantize_v;
    v required). On a GPU, Q and K in two fused Triton kernels after K's mean (each input read once:
    `fused_quantize`); elsewhere (CPU, fake tensors) the torch functions above."""
    if pv_fp8(config):
        if v is None:
            from fa4tune.config import ConfigError

            raise ConfigError("fp8_pv_needs_v", "quantize_inputs: a pv_fp8 config quantizes V too: pass v")
        return (*_quantize_qk(q, k, config, softmax_scale), *quantize_v(v, config.tile_n))
    return _quantize_qk(q, k, config, softmax_scale)


def _quantize_qk(q: torch.Tensor, k: torch.Tensor, config, softmax_scale: float) -> tuple:
    if _use_fused(q):
        try:
            mean = k.mean(dim=1, dtype=torch.float32)
            kq, ks, _ = fused_quantize(k, config.tile_n, mean, smooth=True)
            qq, qs, correction = fused_quantize(q, config.tile_m, mean, smooth=False, softmax_scale=softmax_scale)
            return qq, qs, kq, ks, correction
        except Exception as err:  # noqa: BLE001 - Triton's compile or launch: the torch functions instead
            _fused_failed(err)
    k_smoothed, mean = smooth_k(k)
    (qq, qs), (kq, ks) = quantize_per_tile(q, config.tile_m), quantize_per_tile(k_smoothed, config.tile_n)
    return qq, qs, kq, ks, lse_correction(q, mean, softmax_scale)


_TRITON_KERNEL = []
_FUSED_FAILED: list[str] = []  # why the fused kernels could not run here (then the torch functions do, said once)


def _use_fused(x: torch.Tensor) -> bool:
    return x.is_cuda and not _FUSED_FAILED and not _fake_mode()


def _fused_failed(err: Exception) -> None:
    """The fused quantization failed to compile or launch (no C compiler for Triton's launcher, say): the torch
    functions run from now on, as on the CPU; one warning says why (the results are the same, the time is not)."""
    import warnings

    _FUSED_FAILED.append(f"{type(err).__name__}: {err}")
    warnings.warn(f"fa4tune.fp8: the fused Triton quantization failed ({_FUSED_FAILED[0][:300]}); Q, K and V are "
                  "quantized by the torch functions instead (same values, more time)", RuntimeWarning, stacklevel=3)


def _quantize_kernel():
    """The Triton kernel, defined on first use (triton imported only where a GPU path runs; TRITON_INTERPRET=1
    read then runs it on the CPU, as the tests do): one program per (tile of rows, batch x head)."""
    if _TRITON_KERNEL:
        return _TRITON_KERNEL[0]
    import triton
    import triton.language as tl

    @triton.jit
    def quantize_tile(x_ptr, mean_ptr, out_ptr, scale_ptr, corr_ptr, seqlen, heads, group, dim, tiles,
                      sxb, sxs, sxh, sob, sos, soh, softmax_scale, TILE: tl.constexpr, BLOCK_ROWS: tl.constexpr,
                      BLOCK_D: tl.constexpr, SMOOTH: tl.constexpr, CORRECTION: tl.constexpr, RAW: tl.constexpr):
        tile, bh = tl.program_id(0), tl.program_id(1)
        b, h = (bh // heads).to(tl.int64), bh % heads
        rows = tile * TILE + tl.arange(0, BLOCK_ROWS)
        cols = tl.arange(0, BLOCK_D)
        valid = (tl.arange(0, BLOCK_ROWS) < TILE) & (rows < seqlen)
        mask = valid[:, None] & (cols < dim)[None, :]
        x = tl.load(x_ptr + b * sxb + rows[:, None] * sxs + h * sxh + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(mean_ptr + (b * (heads // group) + h // group) * dim + cols, mask=cols < dim, other=0.0)
        if SMOOTH:  # K minus its mean over the keys (smooth_k)
            x = tl.where(mask, x - mean[None, :], 0.0)
        if CORRECTION:  # softmax_scale * q . mean per row (lse_correction)
            tl.store(corr_ptr + bh * seqlen + rows, tl.sum(x * mean[None, :], axis=1) * softmax_scale, mask=valid)
        amax = tl.max(tl.max(tl.abs(x), axis=1), axis=0)
        scale = tl.where(amax > 0, tl.math.div_rn(amax, 448.0), 1.0)
        values = tl.minimum(tl.maximum(tl.math.div_rn(x, scale), -448.0), 448.0)
        if not RAW:
            values = values.to(tl.float8e4nv)
        tl.store(out_ptr + b * sob + rows[:, None] * sos + h * soh + cols[None, :], values, mask=mask)
        tl.store(scale_ptr + bh * tiles + tile, scale)

    _TRITON_KERNEL.append(quantize_tile)
    return quantize_tile


_TRITON_VT_KERNEL = []


def _vt_kernel():
    """The V^T kernel (quantize_v on a GPU), defined on first use as _quantize_kernel is: one program per 64
    positions of V^T's keys and (batch x kv head); position p holds key p - p % 32 + pv_key_order()[p % 32]."""
    if _TRITON_VT_KERNEL:
        return _TRITON_VT_KERNEL[0]
    import triton
    import triton.language as tl

    @triton.jit
    def quantize_vt(v_ptr, scale_ptr, out_ptr, seqlen, padded, heads, dim, svb, svs, svh,
                    BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr, RAW: tl.constexpr):
        block, bh = tl.program_id(0), tl.program_id(1)
        b, h = (bh // heads).to(tl.int64), bh % heads
        pos = block * BLOCK_P + tl.arange(0, BLOCK_P)
        k = pos % 32
        key = pos - k + 8 * ((k % 4) // 2 + 2 * (k // 16)) + 2 * ((k % 16) // 4) + k % 2  # pv_key_order
        cols = tl.arange(0, BLOCK_D)
        scale = tl.load(scale_ptr + bh * dim + cols, mask=cols < dim, other=1.0)
        mask = (key < seqlen)[:, None] & (cols < dim)[None, :]
        x = tl.load(v_ptr + b * svb + key[:, None] * svs + h * svh + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        values = tl.minimum(tl.maximum(tl.math.div_rn(x, scale[None, :]), -448.0), 448.0)
        if not RAW:
            values = values.to(tl.float8e4nv)
        store = (pos < padded)[:, None] & (cols < dim)[None, :]
        tl.store(out_ptr + (bh * dim + cols[None, :]).to(tl.int64) * padded + pos[:, None], values, mask=store)

    _TRITON_VT_KERNEL.append(quantize_vt)
    return quantize_vt


def fused_quantize_v(v: torch.Tensor, scale: torch.Tensor, padded: int, raw: bool = False) -> torch.Tensor:
    """quantize_v's V^T from v (batch, seqlen_k, kv heads, dim_v) and its per-channel scales (batch, kv heads,
    dim_v), in one Triton kernel: (batch, kv heads, dim_v, padded) e4m3 (fp32 before the cast with `raw`)."""
    v = v if v.stride(-1) == 1 else v.contiguous()
    b, s, h, d = v.shape
    out = torch.empty(b, h, d, padded, device=v.device, dtype=torch.float32 if raw else torch.float8_e4m3fn)
    _vt_kernel()[(-(-padded // 64), b * h)](v, scale.contiguous(), out, s, padded, h, d, v.stride(0), v.stride(1),
                                           v.stride(2), BLOCK_P=64, BLOCK_D=1 << (d - 1).bit_length(), RAW=raw)
    return out


def fused_quantize(x: torch.Tensor, tile: int, mean: torch.Tensor, smooth: bool, softmax_scale: float | None = None,
                   raw: bool = False) -> tuple:
    """quantize_per_tile of x (batch, seqlen, heads, dim) in one Triton kernel: K with smooth=True (x minus mean, the
    keys' mean (batch, heads, dim) fp32); Q with softmax_scale given, which also writes lse_correction's rows
    (batch, heads, seqlen) from the K heads' mean (GQA: heads // group). Returns (values, scales, correction or None);
    `raw` writes the values before the e4m3 cast, in fp32 (the CPU tests' view: the interpreter's e4m3 cast rounds
    some values near a power of two down a binade, the GPU's cvt does not)."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    b, s, h, d = x.shape
    tiles = -(-s // tile)
    out = torch.empty(b, s, h, d, device=x.device, dtype=torch.float32 if raw else torch.float8_e4m3fn)
    scales = torch.empty(b, h, tiles, device=x.device, dtype=torch.float32)
    correction = torch.empty(b, h, s, device=x.device, dtype=torch.float32) if softmax_scale is not None else scales
    mean = mean.contiguous()
    _quantize_kernel()[(tiles, b * h)](
        x, mean, out, scales, correction, s, h, h // mean.shape[1], d, tiles, x.stride(0), x.stride(1), x.stride(2),
        out.stride(0), out.stride(1), out.stride(2), float(softmax_scale or 0.0), TILE=tile,
        BLOCK_ROWS=1 << (tile - 1).bit_length(), BLOCK_D=1 << (d - 1).bit_length(), SMOOTH=smooth,
        CORRECTION=softmax_scale is not None, RAW=raw)
    return out, scales, correction if softmax_scale is not None else None


def attention_fp8_quantized(quantized: tuple, v: torch.Tensor, causal: bool, softmax_scale: float, config) -> tuple:
    """The FP8 kernel on inputs `quantize_inputs` made with the same config and scale: (bf16 output, fp32 LSE)."""
    qq, qs, kq, ks, correction, *pv = quantized  # pv: V^T and its scales with pv_fp8
    if bool(pv) != pv_fp8(config):
        from fa4tune.config import ConfigError

        raise ConfigError("fp8_pv_quantized", f"attention_fp8_quantized: pv_fp8={pv_fp8(config)} but the quantized "
                          f"inputs {'hold' if pv else 'lack'} V^T: quantize them with the same config")
    b, s, h, _ = qq.shape
    out = torch.empty(b, s, h, v.shape[3], device=v.device, dtype=torch.bfloat16)
    lse = torch.empty(b, h, s, device=v.device, dtype=torch.float32)
    fn, _ = compile_fp8(config, qq, qs, kq, ks, v, out, lse, causal, softmax_scale, *pv)
    from flash_attn.cute.testing import is_fake_mode

    if is_fake_mode():  # fake tensors (the static check): compiled, nothing to launch, as upstream's host path does
        return out, lse + correction
    fn(qq.view(torch.uint8), kq.view(torch.uint8), v, out, lse, softmax_scale, None, None, None, None, None, None, None, None,
       None, _aux_none(), None, None, qs, ks, *([pv[0].view(torch.uint8), pv[1]] if pv else [None, None]))
    return out, lse + correction


def attention_fp8(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, softmax_scale: float | None = None,
                  config=None, return_lse: bool = False):
    """Opt-in FP8 attention forward on SM120 (kernel "sm120_fp8"; issue 45): K smoothed, Q and K quantized per tile
    to e4m3 here (their cost is this call's), S = Q K^T on e4m3 mma.sync, the softmax in fp32, P V and the output
    in bf16, the LSE corrected for the smoothing. q (batch, seqlen_q, heads, head_dim), k and v (batch, seqlen_k,
    kv heads, ...), bf16 on the GPU; no backward. Its accuracy is the FP8 gate's (fa4tune/harness/fp8_gate.py), not
    bf16's: call it only where that is wanted. `config`: a ForwardConfig with kernel "sm120_fp8" (default_config).
    Inputs quantized once for several calls: quantize_inputs, then attention_fp8_quantized."""
    config = default_config(q.shape[-1]) if config is None else config
    check_call(q, k, v, causal, config)
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    out, lse = attention_fp8_quantized(quantize_inputs(q, k, config, scale, v), v, causal, scale, config)
    return (out, lse) if return_lse else out


def _fake_mode() -> bool:
    from flash_attn.cute.testing import is_fake_mode

    return is_fake_mode()


def _aux_none():
    from flash_attn.cute.utils import AuxData

    return AuxData(None, None)
