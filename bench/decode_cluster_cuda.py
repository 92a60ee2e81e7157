"""A one-kernel GQA decode with its merge on chip: the last unmeasured road to #13's b1 4K target, as CUDA C++ floors.

One cluster of 8 CTAs per (batch, KV head); CTA r reads keys [r*L/8, (r+1)*L/8) of the head once, the head's G=4 query
rows attend to them with an online softmax per warp, the warps merge in shared memory, and the 8 CTAs merge through
distributed shared memory (each CTA finalizes 16 of the 128 output columns), so nothing is written but the output.
Under SM120's 99 KB rule the bytes in flight live in registers and shared memory. Two layouts:

- `fma`: 16 warps, CUDA-core fp32 FMAs (four query rows would fill a quarter of an MMA tile). Each warp owns 32 keys of
  a 512-key tile: the first RA in registers, SA by cp.async in shared memory (16 warps x SA keys x K,V x 256 B: 96 KB at
  SA=12), the last ones in registers once the first RA are consumed. About 3,000 instructions per warp and tile.
- `mma`: 8 warps of 255 registers, mma.sync m16n8k16 with the keys as M (S^T = K Q^T, the 4 query rows padded to N=8,
  then O^T = V^T P^T), both operands taken from registers in layouts chosen so that no shared-memory round trip is
  needed. Each warp owns 64 keys of the tile: K and V of 32 and K of 16 more in registers (160 per thread), the other
  12 KB per warp by cp.async (96 KB): all of a 4K decode's bytes are requested at the kernel's start, and on longer
  decodes a one-tile-deep pipeline refills each group's registers or stage as soon as the group is consumed.
  (ptxas, on its own, issues the last ~18 of the 40 register loads between group 0's MMAs; a branch on loaded data
  or a __syncwarp did not move them. The floor variant, with no math, issues them all first.)

A `_floor` variant builds the same loads and merge with no attention math (each loaded word is xor-folded into the
partial, so no load is dropped): the floor of its layout. A `_floor_local` variant is that floor launched without
cluster dims, each CTA storing its own partial's slice of the output: the floor less the cluster merge (its
barriers and distributed-shared-memory reads). A `read_TxL` variant (layout `read`) is a plain read of the same
bytes on the same grid, T threads each with L 16-byte loads in flight, then the same merge (`_local`: without it):
the floor of reading one KV head's rows from 64 CTAs at b1. The attention variants are checked against torch
(output and LSE) before they are timed.

A prototype for measurements (bench/gpu_decode_floor.py --cluster-cuda), not a kernel class: CUDA C++ through torch's
NVRTC wrapper, d128, G=4, seqlen_k a multiple of 8 x 512. Compile it without a GPU:

    python3 bench/decode_cluster_cuda.py --arch 120a      # prints registers and spills of each build
    python3 bench/decode_cluster_cuda.py --arch 90a --out DIR   # cubins for an H200 without NVRTC: set
                                                                # FA4TUNE_DECODE_CLUSTER_CUBINS=DIR there
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from dataclasses import dataclass
from pathlib import Path

CUBIN_DIR_ENV = "FA4TUNE_DECODE_CLUSTER_CUBINS"  # cubins written by --out (for a GPU machine without NVRTC)
CLUSTER, TILE = 8, 512  # CTAs per KV head; keys per CTA per tile
PARTIAL_BYTES = (4 * 128 + 8) * 4  # the CTA's partial after the stages: O [4][128], M[4], L[4] (fp32)

HEADER = r"""
#define D 128
#define G 4
#define CL 8
#define MATH __MATH__
#define CLUSTER_MERGE __CLUSTER_MERGE__
#if CLUSTER_MERGE
#define CLUSTER_DIMS __cluster_dims__(CL, 1, 1)
#else
#define CLUSTER_DIMS
#endif
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

__device__ __forceinline__ uint4 ldg4(const uint4* p) {
    uint4 r;
    asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}

// The warps' partials are in shared memory, warp w's at float offset w * wstride: O [G][D] (unnormalized), m[G], l[G]
// (log2 domain). The CTA merges them into its partial (after data_bytes), then the cluster's 8 CTAs merge through
// distributed shared memory, CTA `rank` finalizing columns [16 rank, 16 rank + 16) of the G output rows.
__device__ __forceinline__ void merge_and_store(unsigned char* smem, int wstride, int data_bytes, int rank, int b,
                                                int h, int heads_kv, unsigned short* out, float* lse) {
    const int nwarps = blockDim.x / 32;
    __syncthreads();
    float* cpart = reinterpret_cast<float*>(smem + data_bytes);  // this CTA's partial: [G][D] O, then M[G], L[G]
    for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
        const int g = idx / D, d = idx % D;
        float mx = NEG_INF;
        for (int w = 0; w < nwarps; ++w) mx = fmaxf(mx, reinterpret_cast<float*>(smem)[w * wstride + G * D + g]);
        float o = 0.f, l = 0.f;
        for (int w = 0; w < nwarps; ++w) {
            const float* p = reinterpret_cast<float*>(smem) + w * wstride;
            const float sc = exp2f(p[G * D + g] - mx);
            o += p[g * D + d] * sc;
            l += p[G * D + G + g] * sc;
        }
        cpart[g * D + d] = o;
        if (d == 0) { cpart[G * D + g] = mx; cpart[G * D + G + g] = l; }
    }
#if !CLUSTER_MERGE
    // no cluster merge (a floor's `_local` build, launched without cluster dims): the CTA stores its own partial's
    // 16 columns of each row, the same bytes as the merged store, and no other CTA's shared memory is read
    __syncthreads();
    if (threadIdx.x < G * (D / CL)) {
        const int g = threadIdx.x / (D / CL), d = rank * (D / CL) + threadIdx.x % (D / CL);
        u32 bits = __float_as_uint(cpart[g * D + d] / cpart[G * D + G + g]);
        out[((long)b * heads_kv * G + h * G + g) * D + d] = (unsigned short)(bits >> 16);
        if (rank == 0 && threadIdx.x % (D / CL) == 0) lse[(long)b * heads_kv * G + h * G + g] = cpart[G * D + g];
    }
    return;
#endif
    cluster_sync();
    // the cluster merges through distributed shared memory: CTA `rank` finalizes columns [16 rank, 16 rank + 16)
    const bool mine = threadIdx.x < G * (D / CL);
    const int g = threadIdx.x / (D / CL), d = rank * (D / CL) + threadIdx.x % (D / CL);
    float o = 0.f, l = 0.f, mx = NEG_INF;
    if (mine) {
        float mr[CL], orr[CL], lr[CL];
#pragma unroll
        for (int r = 0; r < CL; ++r) {  // all 24 remote loads in flight at once
            mr[r] = ld_cluster(cpart + G * D + g, r);
            orr[r] = ld_cluster(cpart + g * D + d, r);
            lr[r] = ld_cluster(cpart + G * D + G + g, r);
        }
#pragma unroll
        for (int r = 0; r < CL; ++r) mx = fmaxf(mx, mr[r]);
#pragma unroll
        for (int r = 0; r < CL; ++r) {
            const float sc = exp2f(mr[r] - mx);
            o += orr[r] * sc;
            l += lr[r] * sc;
        }
    }
    // done reading the others' shared memory: arrive now, store while the slowest CTA finishes, wait before leaving
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
    if (mine) {
        u32 bits = __float_as_uint(o / l);
        bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even bf16
        out[((long)b * heads_kv * G + h * G + g) * D + d] = (unsigned short)(bits >> 16);
        if (rank == 0 && threadIdx.x % (D / CL) == 0)
            lse[(long)b * heads_kv * G + h * G + g] = (mx + log2f(l)) * 0.69314718f;
    }
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
"""

FMA = r"""
#define W 16
#define NT (W * 32)
#define KW 32
#define RA __RA__
#define SA __SA__
#define RB (KW - RA - SA)
#define DATA_BYTES (W * SA * 2 * 256)

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

extern "C" __global__ void CLUSTER_DIMS __launch_bounds__(NT, 1)
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
    merge_and_store(smem, SA * 2 * 32 * 2, DATA_BYTES, rank, b, h, heads_kv, out, lse);
}
"""

MMA = r"""
#define W 8
#define NT (W * 32)
#define KW 64                            // keys per warp per 512-key tile: four groups of 16
#define STAGE (3 * 8 * 32)               // uint4 per warp: V of group 2, K and V of group 3, 8 per lane each
#define DATA_BYTES (W * STAGE * 16)

__device__ __forceinline__ void mma16816(float (&c)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ u32 pack_bf16(float lo_, float hi_) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi_), "f"(lo_));
    return r;
}
__device__ __forceinline__ u32 word(const uint4& x, int i) { return i == 0 ? x.x : i == 1 ? x.y : i == 2 ? x.z : x.w; }

// Thread (g, t) = (lane / 4, lane % 4) of a warp, one group of 16 keys:
// - k[2 s + e]: key g (e = 0) or g + 8 (e = 1), head-dim columns [32 s + 8 t, 32 s + 8 t + 8). QK^T sums over the
//   head dim, so its k-steps take the columns in this order: k-step 2 s + j's A registers {a0, a2} are words
//   {2 j, 2 j + 1} of k[2 s] (a1, a3 of k[2 s + 1]), and Q's B registers are the same words of q[s].
// - v[2 slot + hh]: key 2 t, 2 t + 1, 2 t + 8, 2 t + 9 (slot 0-3), columns [16 g + 8 hh, 16 g + 8 hh + 8). O^T = V^T P^T
//   runs 8 m-tiles; m-tile mu's rows g and g + 8 are output columns 16 g + 2 mu and 16 g + 2 mu + 1, so a thread's
//   A registers are byte-permuted pairs of its own words, and its accumulators hold O[2 t, 2 t + 1][16 g .. 16 g + 16).
// - S^T = K Q^T (keys x 8 query columns, 4 real) leaves S[key g, g + 8][query 2 t, 2 t + 1] in the thread; P^T's B
//   registers {P[query g][key 2 t, 2 t + 1]}, {P[query g][key 2 t + 8, 2 t + 9]} come from lanes 4 (2 t) + g / 2 and
//   4 (2 t + 1) + g / 2 in four shuffles.
struct MState {
    float m[2], l[2], acc[8][4];  // queries 2 t and 2 t + 1
};

// k(i), v(i): the thread's uint4 i of the group's K and V (from registers, or read from shared memory where used)
template <class QF, class KF, class VF>
__device__ __forceinline__ void attend16(MState& st, QF q, KF k, VF v, int lane, float scale_log2) {
#if MATH
    const int g = lane >> 2, t = lane & 3;
    float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int s = 0; s < 4; ++s) {
        const uint4 ka = k(2 * s), kb = k(2 * s + 1), qs = q(s);
        mma16816(c, ka.x, kb.x, ka.y, kb.y, qs.x, qs.y);
        mma16816(c, ka.z, kb.z, ka.w, kb.w, qs.z, qs.w);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) c[i] *= scale_log2;
    float mx0 = fmaxf(c[0], c[2]), mx1 = fmaxf(c[1], c[3]);
#pragma unroll
    for (int mask = 4; mask < 32; mask <<= 1) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, mask));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, mask));
    }
    const float mn0 = fmaxf(st.m[0], mx0), mn1 = fmaxf(st.m[1], mx1);
    const float al0 = exp2f(st.m[0] - mn0), al1 = exp2f(st.m[1] - mn1);
    st.m[0] = mn0; st.m[1] = mn1;
    const float p0 = exp2f(c[0] - mn0), p1 = exp2f(c[1] - mn1), p2 = exp2f(c[2] - mn0), p3 = exp2f(c[3] - mn1);
    st.l[0] = st.l[0] * al0 + p0 + p2;
    st.l[1] = st.l[1] * al1 + p1 + p3;
#pragma unroll
    for (int mu = 0; mu < 8; ++mu) {
        st.acc[mu][0] *= al0; st.acc[mu][1] *= al1; st.acc[mu][2] *= al0; st.acc[mu][3] *= al1;
    }
    const u32 x = pack_bf16(p0, p2), y = pack_bf16(p1, p3);  // {P[2t][key g], P[2t][key g+8]}, the same for 2t+1
    const int src1 = 4 * (2 * t) + (g >> 1), src2 = 4 * (2 * t + 1) + (g >> 1);
    const u32 x1 = __shfl_sync(0xffffffffu, x, src1), y1 = __shfl_sync(0xffffffffu, y, src1);
    const u32 x2 = __shfl_sync(0xffffffffu, x, src2), y2 = __shfl_sync(0xffffffffu, y, src2);
    const u32 w1 = (g & 1) ? y1 : x1, w2 = (g & 1) ? y2 : x2;  // {P[g][2t], P[g][2t+8]}, {P[g][2t+1], P[g][2t+9]}
    const u32 b0 = __byte_perm(w1, w2, 0x5410), b1 = __byte_perm(w1, w2, 0x7632);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const uint4 s0 = v(hh), s1 = v(2 + hh), s2 = v(4 + hh), s3 = v(6 + hh);  // keys 2t, 2t+1, 2t+8, 2t+9
#pragma unroll
        for (int wi = 0; wi < 4; ++wi) {
            const int mu = 4 * hh + wi;
            const u32 w0_ = word(s0, wi), w1_ = word(s1, wi), w2_ = word(s2, wi), w3_ = word(s3, wi);
            mma16816(st.acc[mu], __byte_perm(w0_, w1_, 0x5410), __byte_perm(w0_, w1_, 0x7632),
                     __byte_perm(w2_, w3_, 0x5410), __byte_perm(w2_, w3_, 0x7632), b0, b1);
        }
    }
#else
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const uint4 ki = k(i), vi = v(i);
        st.acc[i][0] += __uint_as_float((ki.x ^ vi.x ^ ki.z ^ vi.z) & 0x3f7fffffu);
        st.acc[i][1] += __uint_as_float((ki.y ^ vi.y ^ ki.w ^ vi.w) & 0x3f7fffffu);
    }
#endif
}

extern "C" __global__ void CLUSTER_DIMS __launch_bounds__(NT, 1)
decode_cluster_kernel(const uint4* __restrict__ q, const uint4* __restrict__ k, const uint4* __restrict__ v,
                      unsigned short* __restrict__ out, float* __restrict__ lse, int seqlen_k, int heads_kv,
                      double scale_log2_arg) {
    const float scale_log2 = (float)scale_log2_arg;  // (torch's NVRTC launcher passes Python floats as doubles)
    extern __shared__ __align__(16) unsigned char smem[];
    const int rank = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const long row = (long)heads_kv * (D / 8);  // uint4 per key row of K, V (all KV heads)
    const uint4* kh = k + (long)b * seqlen_k * row + h * (D / 8) + t;        // + 4 s: columns 32 s + 8 t
    const uint4* vh = v + (long)b * seqlen_k * row + h * (D / 8) + 2 * g;    // + hh: columns 16 g + 8 hh
    // Q's G rows wait in the CTA partial's space (unused until the merge) for the B registers of every QK k-step:
    // 16 registers fewer than holding them
    uint4* sq = reinterpret_cast<uint4*>(smem + DATA_BYTES);
    if (threadIdx.x < G * (D / 8)) sq[threadIdx.x] = q[((long)b * heads_kv * G + h * G) * (D / 8) + threadIdx.x];
    __syncthreads();
    auto qr = [=](int s) { return g < G ? sq[g * (D / 8) + 4 * s + t] : make_uint4(0, 0, 0, 0); };
    MState st;
    st.m[0] = st.m[1] = NEG_INF;
    st.l[0] = st.l[1] = 0.f;
#pragma unroll
    for (int mu = 0; mu < 8; ++mu)
#pragma unroll
        for (int i = 0; i < 4; ++i) st.acc[mu][i] = 0.f;
    uint4* stage = reinterpret_cast<uint4*>(smem) + warp * STAGE;  // [V2, K3, V3][8 slots][32 lanes]
    const int per_cta = seqlen_k / CL;
#define KEY_K(grp, slot) ((grp) * 16 + g + 8 * ((slot) & 1))                         /* k[slot]: slot = 2 s + e */
#define KEY_V(grp, slot) ((grp) * 16 + 2 * t + (((slot) >> 1) & 1) + 8 * ((slot) >> 2)) /* v[slot]: 2 key + hh */
#define COL_K(slot) (4 * ((slot) >> 1))
#define COL_V(slot) ((slot) & 1)
    const int tiles = per_cta / (W * KW);
    // A software pipeline one tile deep: each group's registers or stage slots are refilled with the next tile's
    // keys as soon as the group is consumed, so a CTA keeps a whole tile (256 KB) requested at all times.
    uint4 k0[8], v0[8], k1[8], v1[8], k2[8];
    auto key0_of = [&](int tile) { return (long)rank * per_cta + (long)tile * (W * KW) + warp * KW; };
    const int row32 = (int)row;  // (the offsets inside a tile in 32 bits: fewer registers hold them)
    auto load_regs = [&](uint4 (&kr)[8], uint4* vr, int grp, long key0) {
        const uint4 *kt = kh + key0 * row, *vt = vh + key0 * row;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            kr[i] = ldg4(kt + KEY_K(grp, i) * row32 + COL_K(i));
            if (vr) vr[i] = ldg4(vt + KEY_V(grp, i) * row32 + COL_V(i));
        }
    };
    auto stage_v2 = [&](long key0) {  // V of group 2 into stage tensor 0
        const uint4* vt = vh + key0 * row;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const u32 dst = (u32)__cvta_generic_to_shared(stage + (0 * 8 + i) * 32 + lane);
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst), "l"(vt + KEY_V(2, i) * row32 + COL_V(i)));
        }
    };
    auto stage_kv3 = [&](long key0) {  // K and V of group 3 into stage tensors 1 and 2
        const uint4 *kt = kh + key0 * row, *vt = vh + key0 * row;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const u32 dk = (u32)__cvta_generic_to_shared(stage + (1 * 8 + i) * 32 + lane);
            const u32 dv = (u32)__cvta_generic_to_shared(stage + (2 * 8 + i) * 32 + lane);
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dk), "l"(kt + KEY_K(3, i) * row32 + COL_K(i)));
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dv), "l"(vt + KEY_V(3, i) * row32 + COL_V(i)));
        }
    };
    auto from = [](const uint4 (&r)[8]) { return [&r](int i) { return r[i]; }; };
    auto staged = [&](int tensor) { return [=](int i) { return stage[(tensor * 8 + i) * 32 + lane]; }; };
    if (tiles > 0) {
        const long key0 = key0_of(0);
        load_regs(k0, v0, 0, key0);
        load_regs(k1, v1, 1, key0);
        load_regs(k2, nullptr, 2, key0);
        stage_v2(key0);
        asm volatile("cp.async.commit_group;");
        stage_kv3(key0);
        asm volatile("cp.async.commit_group;");
    }
    for (int tile = 0; tile < tiles; ++tile) {
        const bool more = tile + 1 < tiles;
        const long next0 = key0_of(tile + 1);
        attend16(st, qr, from(k0), from(v0), lane, scale_log2);
        if (more) load_regs(k0, v0, 0, next0);
        attend16(st, qr, from(k1), from(v1), lane, scale_log2);
        if (more) load_regs(k1, v1, 1, next0);
        asm volatile("cp.async.wait_group 1;" ::: "memory");  // this tile's V2 (its K3, V3 may still be in flight)
        attend16(st, qr, from(k2), staged(0), lane, scale_log2);
        if (more) { load_regs(k2, nullptr, 2, next0); stage_v2(next0); }
        asm volatile("cp.async.commit_group;");  // (empty on the last tile: the count stays one group per step)
        asm volatile("cp.async.wait_group 1;" ::: "memory");  // this tile's K3, V3
        attend16(st, qr, staged(1), staged(2), lane, scale_log2);
        if (more) stage_kv3(next0);
        asm volatile("cp.async.commit_group;");
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
#if MATH
#pragma unroll
    for (int mask = 4; mask < 32; mask <<= 1) {  // the row sums over the warp's keys (m is the same in every lane)
        st.l[0] += __shfl_xor_sync(0xffffffffu, st.l[0], mask);
        st.l[1] += __shfl_xor_sync(0xffffffffu, st.l[1], mask);
    }
#else
    st.m[0] = st.m[1] = 0.f;
    st.l[0] = st.l[1] = 1.f;
#endif
    __syncwarp();  // the other lanes are done reading their stage slots, which the partials overlay
    float* wpart = reinterpret_cast<float*>(stage);  // [G][D] O, then m[G], l[G]
    if (t < 2) {
#pragma unroll
        for (int mu = 0; mu < 8; ++mu) {
            wpart[(2 * t) * D + 16 * g + 2 * mu] = st.acc[mu][0];
            wpart[(2 * t + 1) * D + 16 * g + 2 * mu] = st.acc[mu][1];
            wpart[(2 * t) * D + 16 * g + 2 * mu + 1] = st.acc[mu][2];
            wpart[(2 * t + 1) * D + 16 * g + 2 * mu + 1] = st.acc[mu][3];
        }
        if (g == 0) {
            wpart[G * D + 2 * t] = st.m[0]; wpart[G * D + 2 * t + 1] = st.m[1];
            wpart[G * D + G + 2 * t] = st.l[0]; wpart[G * D + G + 2 * t + 1] = st.l[1];
        }
    }
    merge_and_store(smem, STAGE * 4, DATA_BYTES, rank, b, h, heads_kv, out, lse);
}
"""


READ = r"""
#define NT __NT__
#define NL __NL__
#define WSTRIDE (G * D + 2 * G)  // floats of one warp's partial
#define DATA_BYTES ((NT / 32) * WSTRIDE * 4)

// A read floor with the cluster's grid: CTA `rank` of head h reads its keys' K and V rows once, NT threads each
// issuing NL 16-byte loads at a time (NT * NL * 16 bytes in flight per CTA), consecutive threads on consecutive
// 16-byte chunks of a row; the words are xor-folded into a fake partial, then the warps' and the cluster's merge run
// as in the attention layouts (or, in a `_local` build, each CTA stores its own slice).
extern "C" __global__ void CLUSTER_DIMS __launch_bounds__(NT, 1)
decode_cluster_kernel(const uint2* __restrict__ q, const uint2* __restrict__ k, const uint2* __restrict__ v,
               unsigned short* __restrict__ out, float* __restrict__ lse, int seqlen_k, int heads_kv, double scale_log2_arg) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int rank = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int per_cta = seqlen_k / CL;
    const long row = (long)heads_kv * (D / 8);  // uint4 per key row of K, V (all KV heads)
    const long first = ((long)b * seqlen_k + (long)rank * per_cta) * row + h * (D / 8);
    const uint4* kh = reinterpret_cast<const uint4*>(k) + first;
    const uint4* vh = reinterpret_cast<const uint4*>(v) + first;
    const int chunks = per_cta * (D / 8);  // 16-byte chunks of each tensor in this CTA's keys
    u32 fold = 0;
    for (int base = 0; base < 2 * chunks; base += NT * NL) {
        uint4 r[NL];
#pragma unroll
        for (int i = 0; i < NL; ++i) {
            const int c = base + i * NT + threadIdx.x, cc = c < chunks ? c : c - chunks;
            const uint4* src = (c < chunks ? kh : vh) + (long)(cc / (D / 8)) * row + cc % (D / 8);
            r[i] = c < 2 * chunks ? ldg4(src) : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int i = 0; i < NL; ++i) fold ^= r[i].x ^ r[i].y ^ r[i].z ^ r[i].w;
    }
    float* wpart = reinterpret_cast<float*>(smem) + warp * WSTRIDE;  // [G][D] O, then m[G], l[G]
#pragma unroll
    for (int i = 0; i < G * D / 32; ++i) wpart[i * 32 + lane] = __uint_as_float(fold & 0x3f7fffffu);
    if (lane < G) { wpart[G * D + lane] = 0.f; wpart[G * D + G + lane] = 1.f; }
    merge_and_store(smem, WSTRIDE, DATA_BYTES, rank, b, h, heads_kv, out, lse);
}
"""


@dataclass(frozen=True)
class Variant:
    layout: str  # "fma", "mma" or "read" (a read floor: no math, the merge)
    math: bool
    RA: int = 12  # fma: keys per warp and tile in registers first
    SA: int = 12  # fma: keys per warp and tile through shared memory
    cluster_merge: bool = True  # False (floors only): no cluster dims, each CTA stores its own partial's slice
    threads: int = 0  # read: threads per CTA
    loads: int = 0  # read: 16-byte loads each thread has in flight

    @property
    def warps(self) -> int:
        return {"fma": 16, "mma": 8}.get(self.layout, self.threads // 32)

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory: the warps' cp.async stages (read: their partials), then the CTA's partial."""
        stages = {"fma": self.warps * self.SA * 2 * 256, "mma": self.warps * 3 * 8 * 32 * 16}.get(
            self.layout, self.warps * PARTIAL_BYTES)  # read: a warp's partial is as large as the CTA's
        return stages + PARTIAL_BYTES

    def source(self) -> str:
        if self.layout == "fma":
            assert self.SA >= 8 and self.RA % 4 == 0 and self.SA % 4 == 0 and self.RA + self.SA <= 32, \
                f"fma layout: RA and SA multiples of 4, SA >= 8 (the warp's partial overlays its stage), RA + SA <= 32; got {self}"
            body = FMA.replace("__RA__", str(self.RA)).replace("__SA__", str(self.SA))
        elif self.layout == "read":
            assert not self.math and self.threads % 32 == 0 and 0 < self.threads <= 1024 and self.loads > 0, \
                f"read layout: a floor (no math), 32-1024 threads in whole warps, loads > 0; got {self}"
            body = READ.replace("__NT__", str(self.threads)).replace("__NL__", str(self.loads))
        else:
            body = MMA
        assert self.cluster_merge or not self.math, "only a floor variant may skip the cluster merge"
        return (HEADER + body).replace("__MATH__", str(int(self.math))).replace(
            "__CLUSTER_MERGE__", str(int(self.cluster_merge)))


VARIANTS = {
    "fma": Variant("fma", True), "fma_ra8": Variant("fma", True, RA=8), "fma_floor": Variant("fma", False),
    "mma": Variant("mma", True), "mma_floor": Variant("mma", False),
    "fma_floor_local": Variant("fma", False, cluster_merge=False),
    "mma_floor_local": Variant("mma", False, cluster_merge=False),
    # read floors: 128 KB (1,024 threads x 8 loads, 512 x 16) or 64 KB (512 x 8) in flight per CTA
    "read_1024x8": Variant("read", False, threads=1024, loads=8),
    "read_1024x8_local": Variant("read", False, threads=1024, loads=8, cluster_merge=False),
    "read_512x16": Variant("read", False, threads=512, loads=16),
    "read_512x16_local": Variant("read", False, threads=512, loads=16, cluster_merge=False),
    "read_512x8_local": Variant("read", False, threads=512, loads=8, cluster_merge=False),
}


def cubin(variant: str, arch: str) -> bytes:
    from torch.cuda._utils import _nvrtc_compile

    binary, _ = _nvrtc_compile(VARIANTS[variant].source(), "decode_cluster_kernel", arch,
                               nvcc_options=["-std=c++17", "-lineinfo"])
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
    fn.set_shared_memory_config(VARIANTS[variant].smem_bytes)
    return fn


def calls(q, k, v, variant: str = "mma"):
    """One launch of the prototype for these tensors; an attention variant is checked against torch (output and
    LSE, fp32 reference, and SDPA) before it is returned."""
    import math

    import torch
    import torch.nn.functional as F

    batch, seqlen, heads_kv, dim = k.shape
    assert q.shape[1] == 1 and q.shape[2] == 4 * heads_kv and dim == 128 and seqlen % (CLUSTER * TILE) == 0, \
        "the prototype runs one query token, 4 query heads per KV head, d128, seqlen_k a multiple of 4096"
    assert all(t.is_contiguous() for t in (q, k, v))
    spec = VARIANTS[variant]
    out = torch.empty_like(q)
    lse = torch.empty(batch, heads_kv * 4, device=q.device, dtype=torch.float32)
    fn = kernel(variant)
    scale_log2 = dim ** -0.5 * math.log2(math.e)
    call = lambda: fn(grid=(CLUSTER, heads_kv, batch), block=(spec.warps * 32, 1, 1),  # noqa: E731
                      args=[q, k, v, out, lse, seqlen, heads_kv, scale_log2], shared_mem=spec.smem_bytes)
    call()
    torch.cuda.synchronize()
    if spec.math:
        qt, kt, vt = (t.transpose(1, 2).float() for t in (q, k, v))
        kt, vt = (t.repeat_interleave(4, dim=1) for t in (kt, vt))
        s = qt @ kt.transpose(-1, -2) * dim ** -0.5
        expect = (torch.softmax(s, -1) @ vt).transpose(1, 2)
        err = (out.float() - expect).abs().max().item()
        lse_err = (lse - torch.logsumexp(s, -1)[..., 0]).abs().max().item()
        assert err < 2e-2 and lse_err < 1e-3, f"cluster decode {variant} is wrong: max error {err}, LSE {lse_err}"
        sdpa = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True)
        assert (out.float() - sdpa.transpose(1, 2).float()).abs().max().item() < 2e-2
    return call


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="compile the prototype's variants for an arch without a GPU")
    parser.add_argument("--arch", default="120a")
    parser.add_argument("--out", default="", help=f"also write the cubins here (for {CUBIN_DIR_ENV})")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from fa4tune.cubin import read_cubin

    for variant, spec in VARIANTS.items():
        binary = cubin(variant, args.arch)
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / cubin_name(variant, args.arch)).write_bytes(binary)
        facts = read_cubin(binary)
        print(f"{variant} sm_{args.arch}: {spec.warps * 32} threads, {facts.registers} registers, spills "
              f"{facts.spill_store_bytes}/{facts.spill_load_bytes} B, stack {facts.stack_bytes} B, dynamic shared "
              f"memory {spec.smem_bytes} B")
    return 0


if __name__ == "__main__":
    sys.exit(main())
