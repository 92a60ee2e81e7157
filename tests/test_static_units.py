"""Pure parts of the static check: cubin tool output parsing, occupancy, metric lines, patch anchors."""

from pathlib import Path

import pytest

from fa4tune.cubin import local_traffic_bytes, parse_resource_usage
from fa4tune.occupancy import occupancy
from fa4tune.static_check import StaticFacts
from fa4tune.static_report import metric_lines
from fa4tune.targets import get_target

TARGET = get_target("sm120")

CUOBJDUMP = """
Resource usage:
 Common:
  GLOBAL:0
 Function kernel_cutlass_kernel_flash_fwd_0:
  REG:255 STACK:160 SHARED:1024 LOCAL:0 CONSTANT[0]:1160 TEXTURE:0 SURFACE:0 SAMPLER:0
"""

SASS = """
        /*0a10*/                   STL [R1+0x10], R4 ;
        /*0a20*/                   STL.64 [R1+0x18], R6 ;
        /*0a30*/                   STL.128 [R1+0x20], R8 ;
        /*0a40*/                   LDL.LU R4, [R1+0x10] ;
        /*0a50*/                   LDL.LU.64 R6, [R1+0x18] ;
        /*0a60*/                   LDS.U.128 R8, [R2] ;
        /*0a70*/                   STS [R3], R9 ;
"""


def test_resource_usage_parse():
    assert parse_resource_usage(CUOBJDUMP) == (255, 160, 1024, 0)
    with pytest.raises(ValueError):
        parse_resource_usage("nothing here")


def elf_header(abi_version: int, flags: int) -> bytes:
    """The first 52 bytes of a CUDA ELF file: what fa4tune.cubin.cubin_sm reads."""
    header = bytearray(52)
    header[:4] = b"\x7fELF"
    header[7], header[8] = 0x41, abi_version  # CUDA's OS/ABI byte, its ABI version
    header[48:52] = flags.to_bytes(4, "little")
    return bytes(header)


def test_the_sm_of_a_cubin_from_its_elf_flags():
    from fa4tune.cubin import cubin_sm

    # the e_flags of cubins ptxas 13.0 writes (ABI version 8) for sm_80, sm_90a and sm_120a
    assert [cubin_sm(elf_header(8, f)) for f in (0x6005004, 0x6005A04, 0x6007802)] == [80, 90, 120]
    assert cubin_sm(elf_header(7, 0x5A)) == 90  # ABI version 7 kept the SM in the low byte
    assert cubin_sm(b"not an ELF file") is None


@pytest.mark.parametrize("shared, sm, own", [
    (1024, 120, 0),  # dynamic shared memory only: cuobjdump shows the reserved KB, ptxas -v shows none
    (1124, 90, 100),  # a 100-byte static array: 1124 in cuobjdump, 100 bytes in ptxas -v
    (0, 120, 0),  # no shared memory at all: no reserved KB in the cubin
    (1024, 80, 1024),  # before sm_90 the cubin's SHARED is the kernel's own
    (1024, None, 1024),  # not a cubin we can read the SM of: taken as it is
])
def test_the_kernels_own_static_shared_memory(shared, sm, own):
    from fa4tune.cubin import own_static_smem

    assert own_static_smem(shared, sm) == own


def test_local_traffic_counts_only_local_memory_ops_by_width():
    assert local_traffic_bytes(SASS) == (4 + 8 + 16, 4 + 8)


def test_occupancy_limits():
    # 128 threads, 255 regs -> 256 regs/thread per warp alloc = 8192 regs/warp, 8 warps fit -> 2 blocks
    occ = occupancy(TARGET, 128, 255, 32768)
    assert (occ.blocks_per_sm, occ.limiter) == (2, "registers")
    # 65 KB of shared memory: one block per SM
    occ = occupancy(TARGET, 128, 128, 65536)
    assert (occ.blocks_per_sm, occ.limiter) == (1, "smem")
    # tiny kernel: threads limit (1536 / 256 = 6 blocks)
    occ = occupancy(TARGET, 256, 32, 1024)
    assert (occ.blocks_per_sm, occ.limiter) == (6, "threads") and occ.occupancy == 1.0
    # 32 KB of tiles with the reserved KB: 3 x 33,792 <= 102,400, so 3 per SM when registers allow (168 x 128 x 3)
    occ = occupancy(TARGET, 128, 168, 32768)
    assert (occ.blocks_per_sm, occ.limiter) == (3, "registers")
    assert occupancy(TARGET, 128, 168, 33109).blocks_per_sm == 3 and occupancy(TARGET, 128, 168, 33110).blocks_per_sm == 2


def test_metric_lines_format():
    ok = StaticFacts("fwd", "d128-causal-bf16", {}, "ok", registers=255, stack_bytes=160, spill_store_bytes=268, spill_load_bytes=244, occupancy=0.0833)
    bad = StaticFacts("fwd", "d64-causal-bf16", {}, "infeasible", reason="smem_capacity: ...")
    lines = metric_lines([ok, bad], TARGET)
    assert lines[:3] == ["static_configs_ok: 1/2", "static_max_registers: 255", "static_spill_bytes: 512"]
    assert all(": " in line and line.split(": ")[0].replace("_", "").isalnum() for line in lines)


def test_patch_stops_on_unknown_upstream_source():
    from fa4tune.sm120_interface import UpstreamMismatch, _replace_once

    with pytest.raises(UpstreamMismatch) as err:
        _replace_once("def f():\n    pass\n", "num_threads = 128\n", "x", "forward num_threads")
    assert "forward num_threads" in str(err.value) and "4.0.0b40" in str(err.value)


def test_the_static_compile_environment_keeps_cubins_out_of_the_working_directory():
    from fa4tune.static_check import compile_env

    dump = Path(compile_env(TARGET)["CUTE_DSL_DUMP_DIR"])
    assert dump.is_dir() and not dump.resolve().is_relative_to(Path.cwd().resolve())
    assert compile_env(TARGET, "/tmp/given")["CUTE_DSL_DUMP_DIR"] == "/tmp/given"


def test_patched_functions_build_against_the_pinned_upstream():
    import experiment
    from fa4tune.sm120_interface import build

    host = build(experiment.kernel_class)
    assert host.flash_attn_fwd.__code__.co_filename.startswith("<fa4tune-patched")
    assert "sm120_config" in host.flash_attn_fwd.__code__.co_varnames
    assert "sm120_config" in host.flash_attn_bwd.__code__.co_varnames
    from flash_attn.cute import interface

    # upstream's own module is untouched
    assert "sm120_config" not in interface._flash_attn_fwd.__code__.co_varnames


def test_shared_storage_is_recorded_on_the_kernel_class_itself_for_its_own_objects_and_restored():
    from fa4tune.fake_compile import recording_shared_storage

    class Storage:
        @staticmethod
        def size_in_bytes():
            return 49152

    class Kernel:
        def _get_shared_storage_cls(self):
            return Storage

    class Inheriting(Kernel):
        pass

    own = Kernel.__dict__["_get_shared_storage_cls"]
    sizes: list[int] = []
    with recording_shared_storage(Kernel, sizes):
        assert Kernel()._get_shared_storage_cls() is Storage
        Inheriting()._get_shared_storage_cls()  # another kernel class's launch: not this one's figure
    with recording_shared_storage(Inheriting, sizes):
        Inheriting()._get_shared_storage_cls()
    assert sizes == [49152, 49152]
    assert Kernel.__dict__["_get_shared_storage_cls"] is own and "_get_shared_storage_cls" not in Inheriting.__dict__


FAKE_CUOBJDUMP = """#!/bin/sh
# a stand-in for cuobjdump: logs its flag, prints the resource usage named by FAKE_USAGE, or a SASS listing
echo "$1" >> "$FAKE_LOG"
if [ "$1" = "--dump-resource-usage" ]; then cat "$FAKE_USAGE"; else cat "$FAKE_SASS"; fi
"""


@pytest.mark.parametrize("usage, sass_read, spills", [
    (CUOBJDUMP, True, (28, 12)),  # a stack frame: the SASS is read and its STL/LDL counted
    (CUOBJDUMP.replace("STACK:160", "STACK:0"), False, (0, 0)),  # no stack, no local memory: no SASS, no spills
    (CUOBJDUMP.replace("STACK:160", "STACK:0").replace("LOCAL:0", "LOCAL:16"), True, (28, 12)),
])
def test_the_sass_is_read_only_when_a_function_has_local_memory(tmp_path, monkeypatch, usage, sass_read, spills):
    from fa4tune.cubin import read_cubin

    tool = tmp_path / "cuobjdump"
    tool.write_text(FAKE_CUOBJDUMP)
    tool.chmod(0o755)
    (tmp_path / "usage.txt").write_text(usage)
    (tmp_path / "sass.txt").write_text(SASS)
    monkeypatch.setenv("FA4TUNE_CUOBJDUMP", str(tool))
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "calls.log"))
    monkeypatch.setenv("FAKE_USAGE", str(tmp_path / "usage.txt"))
    monkeypatch.setenv("FAKE_SASS", str(tmp_path / "sass.txt"))
    facts = read_cubin(b"not a real cubin: the fake tool does not read it")
    calls = (tmp_path / "calls.log").read_text().split()
    assert calls == (["--dump-resource-usage", "-sass"] if sass_read else ["--dump-resource-usage"])
    assert (facts.spill_store_bytes, facts.spill_load_bytes) == spills
    assert facts.registers == 255 and facts.static_smem_bytes == 1024
