"""bench/sass_loops.py: the main loops and the LDSM-to-first-use distances of a synthetic SASS listing; one real sm_90a
compile pair (the record's docs/measurements/2026-12-06-sm90-ldsm-schedule.md: trimmed 64x64 t128 Q_in_regs on llama3-8b
prefill 4k is not prefetched in bf16, prefetched in fp16); a bad --arch is one error line."""

import pytest

import bench_helpers
from bench import sass_loops
from fa4tune.config import ConfigError

FILL = "FFMA R100, R101, R102, R103"  # reads none of the LDSM destinations


def listing(*loops, outer=False) -> str:
    """cuobjdump-like SASS: a preamble with one thread-index read, then per entry of `loops` a loop whose LDSMs are
    read at those distances (by an HMMA's A operand, 4 registers from its base), padded to 64 HMMA, closed by a
    predicated backward branch; `outer`: a uniform branch back over all of them (a loop around the loops)."""
    lines, addr = [], [0]

    def emit(ins):
        lines.append(f"        /*{addr[0]:04x}*/                   {ins} ;                 /* 0x000fe20000000f00 */")
        lines.append("                                                                     /* 0x000fe40000000800 */")
        addr[0] += 16

    emit("S2R R0, SR_TID.X")
    emit("MOV R1, c[0x0][0x28]")
    first = addr[0]
    for distances in loops:
        top, hmma = addr[0], 0
        for n, d in enumerate(distances):
            base = 8 + 4 * n
            emit(f"LDSM.16.M88.4 R{base}, [R2+UR{base}]")  # UR<base> is not R<base>
            emit(f"IADD3 R110, R111, UR{base}, RZ")
            for _ in range(d - 2):
                emit(FILL)
            # the A operand names base-2, whose 4-register range reaches base: a read only with the range expansion
            emit(f"HMMA.16816.F32.BF16 R200, R{base - 2}, R150, R200")
            hmma += 1
        for _ in range(64 - hmma):
            emit("HMMA.16816.F32.BF16 R200, R160, R150, R200")
        emit(f"@P0 BRA 0x{top:x}")
    if outer:
        emit(f"BRA.U !UP0, 0x{first:x}")
    emit("EXIT")
    emit(f"BRA 0x{addr[0]:x}")  # the self-loop at the end: not a loop
    return "\n".join(["\tcode for sm_90a", "\t\tFunction : kernel", *lines]) + "\n"


def test_a_prefetched_listing_two_main_loops_their_distances():
    text = listing([2, 2, 3], [20, 22, 24], outer=True)
    ins = sass_loops.parse_sass(text)
    assert ins[0] == (0, "S2R R0, SR_TID.X") and len(ins) == 2 + 72 + 131 + 3
    loops = sass_loops.main_loops(ins)
    # per LDSM: itself, IADD3, d-2 fills, its HMMA; then the padding HMMA and the branch; the outer loop left out
    assert [len(b) for b in loops] == [3 + 3 + 4 + 61 + 1, 21 + 23 + 25 + 61 + 1]
    assert sass_loops.ldsm_distances(loops[0]) == [2, 2, 3] and sass_loops.ldsm_distances(loops[1]) == [20, 22, 24]
    s = sass_loops.summary(text)
    assert s["s2r_tid"] == 1 and [lp["s2r_tid"] for lp in s["loops"]] == [0, 0]
    assert [(lp["hmma"], lp["ldsm"], lp["ldsm_median"], lp["ldsm_min"]) for lp in s["loops"]] == [(64, 3, 2, 2), (64, 3, 22, 20)]
    assert s["prefetched"] is True and s["registers"] is None  # no cubin facts given


def test_an_unprefetched_unmasked_loop_and_a_listing_without_loops():
    s = sass_loops.summary(listing([22, 22], [2, 2, 9]))  # the unmasked (last) loop decides
    assert s["loops"][-1]["ldsm_median"] == 2 < sass_loops.PREFETCH_MIN_DISTANCE and s["prefetched"] is False
    assert sass_loops.summary(listing())["prefetched"] is None
    few = listing([22]).replace("HMMA.16816.F32.BF16 R200, R160", "FMUL R200, R160", 1)  # 63 HMMA: not a main loop
    assert sass_loops.summary(few)["loops"] == []


def test_a_bad_arch_is_one_error_line():
    with pytest.raises(ConfigError, match="arch"):
        sass_loops.main(["--arch", "sm_80"])
    done = bench_helpers.run_script("sass_loops", "--arch", "sm_100a", timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == ["error: arch: --arch is one of sm_90a, sm_120a, got 'sm_100a'"]


@pytest.mark.compile
def test_the_records_lpt_twin_is_unprefetched_in_fp16_and_the_trimmed_entry_prefetched_in_both_dtypes_on_sm90a():
    """The record's cases as the tree stands: the longest-first twin at GQA 4 unprefetched in fp16 (the models
    twins ran it 22 % slower than trimmed on an H100), prefetched in bf16; the trimmed entry prefetched in both
    since bf16 takes the opaque thread index too (before: bf16 184 registers, median 1;
    docs/measurements/2026-12-06-h100-models-opaque-fp8-wide.md section 2)."""
    rows = {}
    for config in ("64x64x128:q:lpt", "64x64x128:q:t"):
        done = bench_helpers.run_script("sass_loops", "--suite", "models", "--only", "llama3-8b prefill 4k", "--config", config)
        assert done.returncode == 0, done.stderr[-3000:]
        for cells in ([c.strip() for c in line.strip("|").split("|")] for line in done.stdout.splitlines()
                      if line.startswith("| llama3-8b")):
            rows[(cells[0].split()[-1], cells[2].split()[0])] = cells
    assert sorted(rows) == [(d, k) for d in ("bf16", "fp16") for k in ("sm120_tma_lpt", "sm120_tma_trimmed")]
    lpt16 = rows[("fp16", "sm120_tma_lpt")]
    assert float(lpt16[6]) <= 2 and lpt16[7] == "**no**" and lpt16[4] == "0 / 0"
    for key in (("bf16", "sm120_tma_lpt"), ("bf16", "sm120_tma_trimmed"), ("fp16", "sm120_tma_trimmed")):
        assert float(rows[key][6]) >= 20 and rows[key][7] == "yes" and rows[key][4] == "0 / 0", rows[key]
