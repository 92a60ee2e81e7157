"""How the driver counts a kernel's shared memory per CTA: is the 1 KB that cuobjdump shows as "static" shared memory
in every sm_90+ cubin that uses shared memory (SHARED:1024, even with no static declaration) the same kilobyte as the
1 KB the GPU reserves per CTA, or one more?

    python3 bench/gpu_smem_accounting.py      # on a GPU machine; the driver (libcuda) only, no other package

fa4tune's occupancy model (fa4tune/occupancy.py) and the emulation's launch padding (fa4tune/emulated_occupancy.py)
count both. Where the driver counts one, a CTA of 32 KB of tiles is 3 per SM120 SM, not 2. The driver's own
occupancy calculator answers it: one PTX kernel that uses dynamic shared memory (JIT-compiled here by the driver for
this GPU), its function attributes, and the CTAs per SM the driver gives it at dynamic sizes on either side of each
boundary, plus a launch at the largest dynamic size the GPU lets one CTA opt into.
"""

from __future__ import annotations

import ctypes
import glob
import subprocess
import tempfile
from pathlib import Path

PTX = b"""
.version 8.0
.target sm_90
.address_size 64
.extern .shared .align 1024 .b8 dsm[];
.visible .entry k(.param .u64 p){
 .reg .b64 %rd<3>; .reg .b32 %r<3>;
 ld.param.u64 %rd1, [p];
 cvta.to.global.u64 %rd2, %rd1;
 ld.shared.u32 %r1, [dsm];
 st.global.u32 [%rd2], %r1;
 ret;
}
"""

# CUdevice_attribute / CUfunction_attribute values (cuda.h)
MAX_SHARED_MEMORY_PER_MULTIPROCESSOR = 81
MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97
RESERVED_SHARED_MEMORY_PER_BLOCK = 111
FUNC_SHARED_SIZE_BYTES = 1
FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8


def check(rc: int, what: str) -> None:
    if rc != 0:
        raise RuntimeError(f"{what} failed: CUresult {rc}")


def main() -> None:
    cu = ctypes.CDLL("libcuda.so.1")
    check(cu.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    check(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ctx = ctypes.c_void_p()
    check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    name = ctypes.create_string_buffer(256)
    cu.cuDeviceGetName(name, 256, dev)

    def dev_attr(attr: int) -> int:
        value = ctypes.c_int()
        check(cu.cuDeviceGetAttribute(ctypes.byref(value), attr, dev), f"cuDeviceGetAttribute({attr})")
        return value.value

    per_sm, optin, reserved = (dev_attr(a) for a in (MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                                                       RESERVED_SHARED_MEMORY_PER_BLOCK))
    image, how = PTX, "the driver's JIT"
    ptxas = sorted(glob.glob("/usr/local/cuda*/bin/ptxas") + glob.glob("/usr/**/triton/backends/nvidia/bin/ptxas", recursive=True))
    if ptxas:  # the offline compiler's cubin is what the DSL loads; cuobjdump shows SHARED:1024 in such cubins
        with tempfile.TemporaryDirectory() as tmp:
            src, cubin = Path(tmp, "k.ptx"), Path(tmp, "k.cubin")
            src.write_bytes(PTX)
            major, minor = dev_attr(75), dev_attr(76)  # compute capability
            arch = f"sm_{major}{minor}a" if major >= 9 else f"sm_{major}{minor}"
            subprocess.run([ptxas[0], f"-arch={arch}", str(src), "-o", str(cubin)], check=True)
            image, how = cubin.read_bytes(), f"{ptxas[0]} -arch={arch} (a cubin)"
    module = ctypes.c_void_p()
    check(cu.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(image)), "cuModuleLoadData")
    print(f"kernel compiled by {how}")
    fn = ctypes.c_void_p()
    check(cu.cuModuleGetFunction(ctypes.byref(fn), module, b"k"), "cuModuleGetFunction")
    static = ctypes.c_int()
    check(cu.cuFuncGetAttribute(ctypes.byref(static), FUNC_SHARED_SIZE_BYTES, fn), "cuFuncGetAttribute(SHARED_SIZE_BYTES)")
    print(f"device: {name.value.decode()}")
    print(f"shared memory per SM {per_sm} B, opt-in per CTA {optin} B, reserved per CTA {reserved} B")
    print(f"the kernel's static shared memory (CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES): {static.value} B")

    max_dynamic = optin - static.value
    check(cu.cuFuncSetAttribute(fn, FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES, max_dynamic), "cuFuncSetAttribute(MAX_DYNAMIC)")

    def ctas(dynamic: int) -> int:
        n = ctypes.c_int()
        check(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(n), fn, 128, ctypes.c_size_t(dynamic)),
              f"cuOccupancyMaxActiveBlocksPerMultiprocessor(dynamic={dynamic})")
        return n.value

    print()
    print("| CTAs per SM wanted | dynamic B | driver's CTAs per SM | per CTA if static + reserved both count | if one KB counts |")
    print("|---|---|---|---|---|")
    verdicts = []
    for want in (1, 2, 3, 4, 6):
        both = per_sm // want - reserved - static.value  # the largest dynamic size with both counted
        one = per_sm // want - reserved  # the largest with one KB counted
        for dynamic in sorted({both, one}):
            if 0 < dynamic <= max_dynamic:
                got = ctas(dynamic)
                print(f"| {want} | {dynamic} | {got} | {dynamic + static.value + reserved} | {dynamic + reserved} |")
                if dynamic == one and one != both:
                    verdicts.append(got >= want)
    if verdicts:
        counted = "once (the static KB is the reserved KB)" if all(verdicts) else "twice (static and reserved)"
        print(f"\nthe driver counts the kilobyte {counted}")

    # a launch at the largest dynamic size the attribute allows: does static + dynamic fit the opt-in limit?
    out = ctypes.c_void_p()
    check(cu.cuMemAlloc_v2(ctypes.byref(out), ctypes.c_size_t(4)), "cuMemAlloc")
    arg = ctypes.c_void_p(out.value)
    params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(arg), ctypes.c_void_p))
    for dynamic in (max_dynamic, optin):
        if dynamic == optin:
            cu.cuFuncSetAttribute(fn, FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES, optin)
        rc = cu.cuLaunchKernel(fn, 1, 1, 1, 128, 1, 1, ctypes.c_uint(dynamic), None, params, None)
        sync = cu.cuCtxSynchronize() if rc == 0 else None
        print(f"launch with {dynamic} B dynamic (+{static.value} static): CUresult {rc}, sync {sync}")


if __name__ == "__main__":
    main()
