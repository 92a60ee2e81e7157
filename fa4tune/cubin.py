"""Facts read from a compiled cubin with the CUDA tools that ship inside the triton wheel.

`cuobjdump --dump-resource-usage` gives registers, stack frame, static shared and local memory per
kernel. Its SHARED figure for an sm_90+ cubin includes the 1 KB the GPU reserves per CTA whenever the kernel uses
shared memory (SHARED:1024 with no static declaration, 1124 for a 100-byte one, where `ptxas -v` says 0 and 100 bytes);
the driver counts that kilobyte once, as its reserved shared memory per block
(docs/measurements/2026-12-03-h200-smem-accounting.md). So `static_smem_bytes` here is the kernel's own static shared
memory, ptxas's figure: SHARED less that kilobyte on sm_90+. Spill traffic is read from the SASS: the bytes moved by local-memory store (STL) and load
(LDL) instructions, which is what ptxas -v reports as "spill stores/loads" when the stack holds only
spills (the triton wheel's ptxas is too old for the DSL's PTX 9.4, so we read the real cubin instead). A cubin
with no stack frame and no local memory has no such instructions, and its SASS is not read.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

RESERVED_SMEM_IN_CUBIN = 1024  # the per-CTA reserved shared memory that sm_90+ cubins carry in cuobjdump's SHARED
_RESOURCE = re.compile(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")
_LOCAL_OP = re.compile(r"\b(STL|LDL)((?:\.[A-Z0-9]+)*)\b")
_WIDTH = {".64": 8, ".128": 16, ".U8": 1, ".S8": 1, ".U16": 2, ".S16": 2}


class ToolMissing(RuntimeError):
    """cuobjdump is not where the triton wheel puts it."""


def tool_path(name: str) -> Path:
    """Path of a CUDA binary (cuobjdump, nvdisasm, ptxas): FA4TUNE_<NAME> if set (e.g. FA4TUNE_CUOBJDUMP for a CUDA
    toolkit's), else the one shipped in the triton wheel."""
    override = os.environ.get(f"FA4TUNE_{name.upper()}")
    if override:
        path = Path(override)
        if not path.exists():
            raise ToolMissing(f"{name} not found at {path} (FA4TUNE_{name.upper()})")
        return path
    import triton

    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    if not path.exists():
        raise ToolMissing(f"{name} not found at {path} (it ships with the triton wheel; is triton installed?)")
    return path


@dataclass(frozen=True)
class CubinFacts:
    """Resource usage of one kernel in a cubin."""

    registers: int
    stack_bytes: int
    static_smem_bytes: int  # the kernel's own (ptxas -v): cuobjdump's SHARED less the reserved KB on sm_90+
    local_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int


def local_traffic_bytes(sass: str) -> tuple[int, int]:
    """(store bytes, load bytes) of the STL/LDL instructions in a SASS listing."""
    stores = loads = 0
    for op, suffixes in _LOCAL_OP.findall(sass):
        width = 4
        for suffix in re.findall(r"\.[A-Z0-9]+", suffixes):
            width = _WIDTH.get(suffix, width)
        if op == "STL":
            stores += width
        else:
            loads += width
    return stores, loads


def parse_resource_usage(text: str, kernel_substring: str = "kernel") -> tuple[int, int, int, int]:
    """(REG, STACK, SHARED, LOCAL) of the first function whose name contains kernel_substring."""
    current = None
    for line in text.splitlines():
        if line.strip().startswith("Function "):
            current = line.strip()[len("Function "):].rstrip(":")
            continue
        match = _RESOURCE.search(line)
        if match and current is not None and kernel_substring in current:
            return tuple(int(x) for x in match.groups())  # type: ignore[return-value]
    raise ValueError(f"no resource usage for a function containing {kernel_substring!r} in cuobjdump output")


def has_local_memory(text: str) -> bool:
    """Whether any function in cuobjdump's resource usage has a stack frame or local memory (only then can its SASS
    hold STL/LDL: spills live in the stack frame)."""
    return any(int(stack) or int(local) for _, stack, _, local in _RESOURCE.findall(text))


def cubin_sm(cubin: bytes) -> int | None:
    """The SM version a cubin is built for (90 for sm_90a, 120 for sm_120a), from its ELF header's e_flags; None for
    bytes that are not an ELF file. CUDA's ELF ABI version 8 keeps it in bits 8-15, earlier versions in bits 0-7."""
    if len(cubin) < 52 or cubin[:4] != b"\x7fELF":
        return None
    flags = int.from_bytes(cubin[48:52], "little")
    return (flags >> 8) & 0xFF if cubin[8] >= 8 else flags & 0xFF


def own_static_smem(shared: int, sm: int | None) -> int:
    """The kernel's own static shared memory from cuobjdump's SHARED: less the reserved kilobyte on sm_90+."""
    if sm is not None and sm >= 90 and shared >= RESERVED_SMEM_IN_CUBIN:
        return shared - RESERVED_SMEM_IN_CUBIN
    return shared


def read_cubin(cubin: bytes) -> CubinFacts:
    """Run cuobjdump on cubin bytes and return the kernel's facts.

    The SASS listing (for the spill traffic) is read only when some function has local memory: without any, there is
    no STL/LDL to count, and the listing is most of the cost (0.6-0.9 s per cubin, against ~0.01 s for the resource
    usage; a compile takes 4-6 s)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        cuobjdump = str(tool_path("cuobjdump"))
        usage = subprocess.run([cuobjdump, "--dump-resource-usage", str(path)], capture_output=True, text=True, check=True, timeout=120)
        registers, stack, shared, local = parse_resource_usage(usage.stdout)
        stores = loads = 0
        if has_local_memory(usage.stdout):
            sass = subprocess.run([cuobjdump, "-sass", str(path)], capture_output=True, text=True, check=True, timeout=120)
            stores, loads = local_traffic_bytes(sass.stdout)
    return CubinFacts(registers, stack, own_static_smem(shared, cubin_sm(cubin)), local, stores, loads)
