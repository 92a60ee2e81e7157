"""A one-kernel GQA decode with its merge on chip: the last unmeasured road to #13's b1 4K target, as a CUDA C++ floor.

One cluster of 8 CTAs per (batch, KV head); CTA r reads keys [r*L/8, (r+1)*L/8) of the head once, the head's G=4 query
rows attend to them (an online softmax per warp, CUDA-core fp32 FMAs: four query rows would fill a quarter of an MMA
tile), the warps merge in shared memory, and the 8 CTAs merge through distributed shared memory (each CTA finalizes 16
of the 128 output columns), so nothing is written but the output. Under SM120's 99 KB rule the bytes in flight live in
registers and shared memory: each warp owns 32 keys of a 512-key tile, the first RA in registers, SA by cp.async in
shared memory (16 warps x SA keys x K,V x 256 B: 96 KB at SA=12), the last RB in registers once the first RA are
consumed.

MATH=0 builds the same loads and merge with no attention math (each loaded word is xor-folded into the partial, so no
load is dropped): the floor of this layout; MATH=1 is the attention, checked against torch SDPA before it is timed.

It is a prototype for measurements (bench/gpu_decode_floor.py --cluster-cuda), not a kernel class: CUDA C++ through
torch's NVRTC wrapper, d128, G=4, and seqlen_k a multiple of 8 x 512. Compile it without a GPU:

    python3 bench/decode_cluster_cuda.py --arch 120a      # prints registers and spills of each build
    python3 bench/decode_cluster_cuda.py --arch 90a --out DIR   # cubins for an H200 without NVRTC: set
                                                                # FA4TUNE_DECODE_CLUSTER_CUBINS=DIR there
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path

CUBIN_DIR_ENV = "FA4TUNE_DECODE_CLUSTER_CUBINS"  # cubins written by --out (for a GPU machine without NVRTC)
CLUSTER, WARPS, TILE = 8, 16, 512  # CTAs per KV head, warps per CTA, keys per CTA per tile (32 per warp)
SOURCE = r"""

#define D 128
#define G 4
#define CL 8
#define W 16
#define NT (W * 32)
#define KW 32
#define RA __RA__
#define SA __SA__
#define RB (KW - RA - SA)
#define MATH __MATH__
#define DATA_BYTES (W * SA * 2 * 256)

typedef unsigned int u32;
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// a float of CTA `rank`'s shared memory at the address `local` has in this CTA
__device__ __forceinline__ float ld_cluster(const float* local, int rank) {
    u32 addr = (u32)__cvta_generic_to_shared(local), remote;
    float x;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(x) : "r"(remote) : "memory");
    return x;
}

__device__ __forceinline__ float lo(u32 w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi(u32 w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ uint2 ldg2(const uint2* p) {
    uint2 r;
    asm volatile("ld.global.nc.v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
    return r;
}

// a register select (a ternary on array elements becomes an address select, and the array goes to local memory)
__device__ __forceinline__ float sel(bool p, float a, float b) {
    float r;
    asm("{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %3, 0;\n\tselp.f32 %0, %1, %2, q;\n\t}" : "=f"(r) : "f"(a), "f"(b), "r"((int)p));
    return r;
}

// one step of the transposed reduction: lanes with `MASK` set keep x[HALF..2 HALF), the others x[0..HALF), each
// adding its partner's copy; the kept half moves to x[0..HALF)
template <int HALF, int MASK>
__device__ __forceinline__ void reduce_step(float* x, int lane) {
    const bool upper = lane & MASK;
#pragma unroll
    for (int i = 0; i < HALF; ++i) {
        const float send = sel(upper, x[i], x[i + HALF]), keep = sel(upper, x[i + HALF], x[i]);
        x[i] = keep + __shfl_xor_sync(0xffffffffu, send, MASK);
    }
}

struct State {
    float m[G], l[G], acc[G][4];
};

// Four keys of this warp: k[j], v[j] are this lane's 4 columns (lane*4 .. lane*4+3) of key j.
__device__ __forceinline__ void attend4(State& st, const float (&qf)[G][4], const uint2 (&k)[4], const uint2 (&v)[4],
                                        int lane) {
#if MATH
    float x[16];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        float kf[4] = {lo(k[j].x), hi(k[j].x), lo(k[j].y), hi(k[j].y)};
#pragma unroll
        for (int q = 0; q < G; ++q)
            x[j * 4 + q] = qf[q][0] * kf[0] + qf[q][1] * kf[1] + qf[q][2] * kf[2] + qf[q][3] * kf[3];
    }
    // transposed reduction over the 32 lanes: after it, lanes 2i and 2i+1 hold the full sum of x[i]
    reduce_step<8, 16>(x, lane);
    reduce_step<4, 8>(x, lane);
    reduce_step<2, 4>(x, lane);
    reduce_step<1, 2>(x, lane);
    float s = x[0] + __shfl_xor_sync(0xffffffffu, x[0], 1);  // s of key (lane>>3)&3, query (lane>>1)&3
    float gmax = fmaxf(s, __shfl_xor_sync(0xffffffffu, s, 8));
    gmax = fmaxf(gmax, __shfl_xor_sync(0xffffffffu, gmax, 16));
    float mnew[G], alpha[G];
#pragma unroll
    for (int q = 0; q < G; ++q) {
        mnew[q] = fmaxf(st.m[q], __shfl_sync(0xffffffffu, gmax, 2 * q));
        alpha[q] = exp2f(st.m[q] - mnew[q]);
    }
    const int qo = (lane >> 1) & 3;
    const float mo = qo == 0 ? mnew[0] : qo == 1 ? mnew[1] : qo == 2 ? mnew[2] : mnew[3];
    const float po = exp2f(s - mo);
#pragma unroll
    for (int q = 0; q < G; ++q) {
        st.l[q] *= alpha[q];
#pragma unroll
        for (int i = 0; i < 4; ++i) st.acc[q][i] *= alpha[q];
        st.m[q] = mnew[q];
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        float vf[4] = {lo(v[j].x), hi(v[j].x), lo(v[j].y), hi(v[j].y)};
#pragma unroll
        for (int q = 0; q < G; ++q) {
            const float p = __shfl_sync(0xffffffffu, po, 2 * (j * 4 + q));
            st.l[q] += p;
#pragma unroll
            for (int i = 0; i < 4; ++i) st.acc[q][i] += p * vf[i];
        }
    }
#else
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        st.acc[j][0] += __uint_as_float((k[j].x ^ v[j].x) & 0x3f7fffffu);
        st.acc[j][1] += __uint_as_float((k[j].y ^ v[j].y) & 0x3f7fffffu);
    }
#endif
}

extern "C" __global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(NT, 1)
decode_cluster_kernel(const uint2* __restrict__ q, const uint2* __restrict__ k, const uint2* __restrict__ v,
               unsigned short* __restrict__ out, float* __restrict__ lse, int seqlen_k, int heads_kv, double scale_log2_arg) {
    const float scale_log2 = (float)scale_log2_arg;  // (torch's NVRTC launcher passes Python floats as doubles)
    extern __shared__ __align__(16) unsigned char smem[];
    const int rank = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long row = (long)heads_kv * (D / 4);  // uint2 per key row of K, V (all KV heads)
    const uint2* kh = k + (long)b * seqlen_k * row + h * (D / 4) + lane;
    const uint2* vh = v + (long)b * seqlen_k * row + h * (D / 4) + lane;

    float qf[G][4];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        uint2 w = q[((long)b * heads_kv * G + h * G + g) * (D / 4) + lane];
        qf[g][0] = lo(w.x) * scale_log2; qf[g][1] = hi(w.x) * scale_log2;
        qf[g][2] = lo(w.y) * scale_log2; qf[g][3] = hi(w.y) * scale_log2;
    }
    State st;
#pragma unroll
    for (int g = 0; g < G; ++g) {
        st.m[g] = NEG_INF; st.l[g] = 0.f;
#pragma unroll
        for (int i = 0; i < 4; ++i) st.acc[g][i] = 0.f;
    }
    uint2* stage = reinterpret_cast<uint2*>(smem) + warp * (SA * 2 * 32);  // this warp's keys: [SA][K, V][32 lanes]
    const int per_cta = seqlen_k / CL;
    for (int tile = 0; tile < per_cta / (W * KW); ++tile) {
        const long key0 = (long)rank * per_cta + tile * (W * KW) + warp * KW;
        uint2 ka[RA], va[RA];
#pragma unroll
        for (int j = 0; j < RA; ++j) { ka[j] = ldg2(kh + (key0 + j) * row); va[j] = ldg2(vh + (key0 + j) * row); }
#pragma unroll
        for (int j = 0; j < SA; ++j) {
            const u32 dk = (u32)__cvta_generic_to_shared(stage + (j * 2) * 32 + lane);
            const u32 dv = (u32)__cvta_generic_to_shared(stage + (j * 2 + 1) * 32 + lane);
            asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" :: "r"(dk), "l"(kh + (key0 + RA + j) * row));
            asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" :: "r"(dv), "l"(vh + (key0 + RA + j) * row));
            if (j == SA / 2 - 1) asm volatile("cp.async.commit_group;");
        }
        asm volatile("cp.async.commit_group;");
#pragma unroll
        for (int j = 0; j < RA; j += 4) {
            uint2 kk[4] = {ka[j], ka[j + 1], ka[j + 2], ka[j + 3]}, vv[4] = {va[j], va[j + 1], va[j + 2], va[j + 3]};
            attend4(st, qf, kk, vv, lane);
        }
        uint2 kb[RB], vb[RB];
#pragma unroll
        for (int j = 0; j < RB; ++j) {
            kb[j] = ldg2(kh + (key0 + RA + SA + j) * row); vb[j] = ldg2(vh + (key0 + RA + SA + j) * row);
        }
#pragma unroll
        for (int j = 0; j < SA; j += 4) {
            if (j == 0) asm volatile("cp.async.wait_group 1;" ::: "memory");  // this lane's first SA/2 keys
            if (j <= SA / 2 && j + 4 > SA / 2) asm volatile("cp.async.wait_group 0;" ::: "memory");
            uint2 kk[4], vv[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) { kk[i] = stage[((j + i) * 2) * 32 + lane]; vv[i] = stage[((j + i) * 2 + 1) * 32 + lane]; }
            attend4(st, qf, kk, vv, lane);
        }
#pragma unroll
        for (int j = 0; j < RB; j += 4) {
            uint2 kk[4] = {kb[j], kb[j + 1], kb[j + 2], kb[j + 3]}, vv[4] = {vb[j], vb[j + 1], vb[j + 2], vb[j + 3]};
            attend4(st, qf, kk, vv, lane);
        }
    }
#if !MATH
#pragma unroll
    for (int g = 0; g < G; ++g) { st.m[g] = 0.f; st.l[g] = 1.f; }
#endif
    // the warps merge in shared memory: each warp writes its m, l, acc into its own stage (no other warp reads it yet)
    float* wpart = reinterpret_cast<float*>(smem) + warp * (SA * 2 * 32 * 2);  // [G][D] acc, then m[G], l[G]
    __syncwarp();  // the other lanes are done reading their stage slots, which wpart overlays
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
        for (int i = 0; i < 4; ++i) wpart[g * D + lane * 4 + i] = st.acc[g][i];
#pragma unroll
    for (int g = 0; g < G; ++g)  // (a lane-indexed st.m[lane] would put the state in local memory)
        if (lane == g) { wpart[G * D + g] = st.m[g]; wpart[G * D + G + g] = st.l[g]; }
    __syncthreads();
    float* cpart = reinterpret_cast<float*>(smem + DATA_BYTES);  // this CTA's partial: [G][D] O, then M[G], L[G]
    {
        const int g = threadIdx.x / D, d = threadIdx.x % D;  // NT == G * D
        const int stride = SA * 2 * 32 * 2;
        float mx = NEG_INF;
        for (int w = 0; w < W; ++w) mx = fmaxf(mx, reinterpret_cast<float*>(smem)[w * stride + G * D + g]);
        float o = 0.f, l = 0.f;
        for (int w = 0; w < W; ++w) {
            const float* p = reinterpret_cast<float*>(smem) + w * stride;
            const float sc = exp2f(p[G * D + g] - mx);
            o += p[g * D + d] * sc;
            l += p[G * D + G + g] * sc;
        }
        cpart[g * D + d] = o;
        if (d == 0) { cpart[G * D + g] = mx; cpart[G * D + G + g] = l; }
    }
    cluster_sync();
    // the cluster merges through distributed shared memory: CTA `rank` finalizes columns [16 rank, 16 rank + 16)
    if (threadIdx.x < G * (D / CL)) {
        const int g = threadIdx.x / (D / CL), d = rank * (D / CL) + threadIdx.x % (D / CL);
        float mr[CL], mx = NEG_INF;
#pragma unroll
        for (int r = 0; r < CL; ++r) {
            mr[r] = ld_cluster(cpart + G * D + g, r);
            mx = fmaxf(mx, mr[r]);
        }
        float o = 0.f, l = 0.f;
#pragma unroll
        for (int r = 0; r < CL; ++r) {
            const float sc = exp2f(mr[r] - mx);
            o += ld_cluster(cpart + g * D + d, r) * sc;
            l += ld_cluster(cpart + G * D + G + g, r) * sc;
        }
        u32 bits = __float_as_uint(o / l);
        bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even bf16
        out[((long)b * heads_kv * G + h * G + g) * D + d] = (unsigned short)(bits >> 16);
        if (rank == 0 && threadIdx.x % (D / CL) == 0)
            lse[(long)b * heads_kv * G + h * G + g] = (mx + log2f(l)) * 0.69314718f;
    }
    cluster_sync();  // no CTA leaves while another still reads its shared memory
}
"""

# keys per warp and 512-key tile: RA in registers first, SA through shared memory, the rest in registers last
VARIANTS = {"math": dict(RA=12, SA=12, MATH=1), "math_ra8": dict(RA=8, SA=12, MATH=1),
            "floor": dict(RA=12, SA=12, MATH=0)}


def source(RA: int, SA: int, MATH: int) -> str:
    assert SA >= 8 and RA % 4 == 0 and SA % 4 == 0 and (32 - RA - SA) % 4 == 0 and RA + SA <= 32, (RA, SA)
    return SOURCE.replace("__RA__", str(RA)).replace("__SA__", str(SA)).replace("__MATH__", str(MATH))


def smem_bytes(SA: int) -> int:
    """Dynamic shared memory: the warps' cp.async stages, then the CTA's partial (O [4][128] fp32, M[4], L[4])."""
    return WARPS * SA * 2 * 256 + (4 * 128 + 8) * 4


def cubin(variant: str, arch: str) -> bytes:
    from torch.cuda._utils import _nvrtc_compile

    binary, _ = _nvrtc_compile(source(**VARIANTS[variant]), "decode_cluster_kernel", arch, nvcc_options=["-std=c++17", "-lineinfo"])
    return binary


def cubin_name(variant: str, arch: str) -> str:
    return f"decode_cluster_{variant}_sm_{arch}.cubin"


@functools.cache
def kernel(variant: str):
    import torch
    from torch.cuda._utils import _cuda_load_module

    major, minor = torch.cuda.get_device_capability()
    arch = f"{major}{minor}{'a' if major >= 9 else ''}"
    built = Path(os.environ.get(CUBIN_DIR_ENV, "/nonexistent")) / cubin_name(variant, arch)
    binary = built.read_bytes() if built.exists() else cubin(variant, arch)  # a cubin built elsewhere, else NVRTC here
    fn = _cuda_load_module(binary, ["decode_cluster_kernel"])["decode_cluster_kernel"]
    fn.set_shared_memory_config(smem_bytes(VARIANTS[variant]["SA"]))
    return fn


def calls(q, k, v, variant: str = "math"):
    """One launch of the prototype for these tensors; the attention variant is checked against torch SDPA (output
    and LSE) before it is returned."""
    import math

    import torch
    import torch.nn.functional as F

    batch, seqlen, heads_kv, dim = k.shape
    assert q.shape[1] == 1 and q.shape[2] == 4 * heads_kv and dim == 128 and seqlen % (CLUSTER * TILE) == 0, \
        "the prototype runs one query token, 4 query heads per KV head, d128, seqlen_k a multiple of 4096"
    out = torch.empty_like(q)
    lse = torch.empty(batch, heads_kv * 4, device=q.device, dtype=torch.float32)
    fn = kernel(variant)
    scale_log2 = dim ** -0.5 * math.log2(math.e)
    smem = smem_bytes(VARIANTS[variant]["SA"])
    call = lambda: fn(grid=(CLUSTER, heads_kv, batch), block=(WARPS * 32, 1, 1),  # noqa: E731
                      args=[q, k, v, out, lse, seqlen, heads_kv, scale_log2], shared_mem=smem)
    call()
    torch.cuda.synchronize()
    if VARIANTS[variant]["MATH"]:
        qt, kt, vt = (t.transpose(1, 2).float() for t in (q, k, v))
        kt, vt = (t.repeat_interleave(4, dim=1) for t in (kt, vt))
        s = qt @ kt.transpose(-1, -2) * dim ** -0.5
        expect = (torch.softmax(s, -1) @ vt).transpose(1, 2)
        err = (out.float() - expect).abs().max().item()
        lse_err = (lse - torch.logsumexp(s, -1)[..., 0]).abs().max().item()
        assert err < 2e-2 and lse_err < 1e-3, f"cluster decode prototype is wrong: max error {err}, LSE {lse_err}"
        sdpa = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True)
        assert (out.float() - sdpa.transpose(1, 2).float()).abs().max().item() < 2e-2
    return call


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="compile the prototype for an arch without a GPU")
    parser.add_argument("--arch", default="120a")
    parser.add_argument("--out", default="", help=f"also write the cubins here (for {CUBIN_DIR_ENV})")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from fa4tune.cubin import read_cubin

    for variant in VARIANTS:
        binary = cubin(variant, args.arch)
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / cubin_name(variant, args.arch)).write_bytes(binary)
        facts = read_cubin(binary)
        print(f"{variant} sm_{args.arch}: {facts.registers} registers, spills {facts.spill_store_bytes}/"
              f"{facts.spill_load_bytes} B, stack {facts.stack_bytes} B, dynamic shared memory "
              f"{smem_bytes(VARIANTS[variant]['SA'])} B")
    return 0


if __name__ == "__main__":
    sys.exit(main())
