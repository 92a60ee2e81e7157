"""bench/mma_rate.py (issue #45 item 1): what sm_90a and sm_120a compile each mma.sync to, read from the SASS on the
CPU. The H200 the project emulates SM120 on has no FP8 mma.sync: it converts e4m3 to fp16 and runs two HMMA.16816
per m16n8k32, so its FP8 figure is not an FP8 rate; SM120 runs QMMA.16832."""

from bench import mma_rate


def _summary(op, arch):
    return mma_rate.sass_summary(mma_rate.compile_op(op, arch))


def test_bf16_is_one_hmma_per_mma_on_both_arches_and_e4m3_is_native_only_on_sm120a():
    bf16_90, bf16_120 = _summary("bf16 m16n8k16", "90a"), _summary("bf16 m16n8k16", "120a")
    assert set(bf16_90["mma"]) == set(bf16_120["mma"]) == {"HMMA.16816.F32.BF16"}
    assert mma_rate.native("bf16 m16n8k16", "90a", bf16_90) and mma_rate.native("bf16 m16n8k16", "120a", bf16_120)
    fp8_120 = _summary("e4m3 m16n8k32", "120a")
    assert fp8_120["mma"] == {"QMMA.16832.F32.E4M3.E4M3": bf16_120["mma"]["HMMA.16816.F32.BF16"]}  # one QMMA per mma
    assert mma_rate.native("e4m3 m16n8k32", "120a", fp8_120)
    fp8_90 = _summary("e4m3 m16n8k32", "90a")
    assert not mma_rate.native("e4m3 m16n8k32", "90a", fp8_90)
    assert set(fp8_90["mma"]) == {"HMMA.16816.F32"} and fp8_90["conversions"] > 0  # converted to fp16 first
    # every chain's product is computed (no product shared between chains or hoisted out of the loop): two k16
    # HMMAs per k32 mma, twice bf16's count
    assert fp8_90["mma"]["HMMA.16816.F32"] == 2 * bf16_90["mma"]["HMMA.16816.F32.BF16"]


def test_the_sass_table_says_which_ops_are_lowered():
    rows = mma_rate.sass_table()
    lowered = [row for row in rows if row.endswith("no: lowered |")]
    assert lowered == [row for row in rows if row.startswith("| e4m3 m16n8k32 | sm_90a |")] and len(lowered) == 1
