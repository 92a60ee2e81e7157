"""The TMA-fed SM120 forward (kernels/tma_forward_sm120.py, kernel="sm120_tma"): compile, static facts, layout, rules.

Correctness on a GPU is bench/gpu_twins.py's job (H200, SM120 kernels emulated); these tests are what a CPU can show.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import experiment
from fa4tune.config import ForwardConfig, ProblemClass
from fa4tune.feasibility import check_forward, forward_smem_bytes
from fa4tune.kernel_class import forward_kernels
from fa4tune.space import FORWARD_DOMAIN, feasible_forward, forward_domain
from fa4tune.static_check import StaticJob, run_static
from fa4tune.targets import get_target
from kernels.tma_forward_sm120 import TmaForwardSm120
from kernels.tuned_forward_sm120 import TunedForwardSm120

pytestmark = pytest.mark.compile

ROOT = Path(__file__).resolve().parent.parent
TARGET = get_target("sm120")
D128_CAUSAL, D128, D64 = ProblemClass(128, 128, True), ProblemClass(128, 128, False), ProblemClass(64, 64, False)
D128_CAUSAL_GQA4 = ProblemClass(128, 128, True, 4)


def tma(tile_m=128, tile_n=64, num_threads=128, num_stages=2, Q_in_regs=False):
    return ForwardConfig(tile_m, tile_n, num_threads, num_stages, Q_in_regs, kernel="sm120_tma")


JOBS = {
    "d128_causal_1stage": StaticJob("fwd", tma(num_stages=1), D128_CAUSAL),
    "d128_2stage": StaticJob("fwd", tma(), D128),
    "d64_1stage": StaticJob("fwd", tma(tile_n=128, num_stages=1), D64),
    "gqa4_causal_2stage": StaticJob("fwd", tma(), D128_CAUSAL_GQA4),
    "over_99k": StaticJob("fwd", tma(tile_n=128), D128),
}


@pytest.fixture(scope="module")
def facts(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache") / "facts.jsonl"
    results = run_static(JOBS.values(), TARGET, ROOT / "experiment.py", workers=1, cache_path=cache)
    return dict(zip(JOBS, results))


@pytest.mark.parametrize("name", [n for n in JOBS if n != "over_99k"])
def test_compiles_for_sm120a_and_static_facts_are_read(facts, name):
    f, job = facts[name], JOBS[name]
    assert f.status == "ok", f.reason
    assert 0 < f.registers <= 255 and f.num_threads == job.config.num_threads
    assert f.spill_store_bytes >= 0 and f.stack_bytes >= 0
    # the launch's shared storage is exactly the feasibility formula: tiles + mbarriers (8 B each, no padding)
    assert f.dynamic_smem_bytes == f.declared_smem_bytes == TmaForwardSm120.smem_bytes(job.config, job.problem_class)[0]
    assert f.blocks_per_sm >= 1 and f.occupancy > 0


def test_shared_storage_measured(facts):
    # Recorded 2026-12-03 (flash-attn-4 4.0.0b36, nvidia-cutlass-dsl 4.8.1): tiles + 8 B per mbarrier (5 or 3); until
    # 2026-12-02 the storage padded its mbarriers to 1024 B
    assert facts["d128_2stage"].dynamic_smem_bytes == 98304 + 40  # Q 32 KB + 2 x (K 16 KB + V 16 KB)
    assert facts["d128_causal_1stage"].dynamic_smem_bytes == 65536 + 24
    assert facts["d64_1stage"].dynamic_smem_bytes == 49152 + 24


def test_tma_loads_need_fewer_registers_than_cp_async(facts):
    # Recorded 2026-11-29: upstream's cp.async kernel, same config (test_static_check.py), is at 255
    # registers with a 160-byte stack; the TMA kernel keeps no per-thread load addresses or predicates.
    f = facts["d128_causal_1stage"]
    assert f.registers == 255 and f.stack_bytes <= 16


def test_over_99k_is_rejected_by_the_tma_rule_without_compiling(facts):
    f = facts["over_99k"]
    assert f.status == "infeasible" and f.compile_seconds == 0
    assert f.reason.startswith("smem_capacity: needs 163880 B") and "mbarriers" in f.reason


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    request = {
        # (head_dim, rows, stages): 128-, 64- and 32-byte swizzles, the three TMA modes upstream's layouts use
        "layouts": [[128, 64, 2], [96, 64, 1], [64, 128, 1], [32, 32, 1], [48, 32, 1]],
        "compiles": [
            [tma(num_stages=2).to_dict(), 128, True, 1],
            [tma(num_stages=1).to_dict(), 96, True, 1],
            [tma(num_stages=1).to_dict(), 128, True, 3],  # tile_m % qhead_per_kvhead != 0: Q by cp.async
        ],
    }
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "tma_probe.py"), str(tmp_path_factory.mktemp("dump"))],
        input=json.dumps(request), capture_output=True, text=True, timeout=600,
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("TMAPROBE ")), None)
    assert line, proc.stderr[-3000:]
    return json.loads(line[len("TMAPROBE "):])


def test_tma_writes_the_bytes_the_ldmatrix_partitions_read(probe):
    swizzles = {}
    for case in probe["layouts"]:
        assert case["coordinates"] == case["rows"] * ((case["head_dim"] + 15) // 16 * 16) * case["stages"]
        assert case["mismatches"] == 0, case
        swizzles[case["head_dim"]] = case["swizzle"]
    assert swizzles == {128: "S<3,4,3>", 64: "S<3,4,3>", 96: "S<2,4,3>", 32: "S<2,4,3>", 48: "S<1,4,3>"}


def test_each_tile_is_a_few_whole_boxes(probe):
    d128, d96, gqa3 = probe["compiles"]
    # 2 boxes of 64 columns per 128-wide tile (128-byte swizzle), at 10 load sites: Q, the prologue's
    # 2 K + 1 V, and V + K in each of the 3 inlined mainloop bodies; barriers armed with whole tiles
    assert d128["tma_copies"] == 10 * 2 and d128["cp_async_copies"] == 0
    assert d128["expect_tx_bytes"] == [64 * 128 * 2, 128 * 128 * 2]
    # head_dim 96: 3 boxes of 32 columns (64-byte swizzle) at 8 sites (1 stage)
    assert d96["tma_copies"] == 8 * 3 and d96["expect_tx_bytes"] == [64 * 96 * 2, 128 * 96 * 2]
    # GQA 3 with tile_m=128: Q goes by upstream's cp.async PackGQA load, K and V still by TMA
    assert gqa3["cp_async_copies"] > 0 and gqa3["tma_copies"] == 7 * 2 and gqa3["expect_tx_bytes"] == [64 * 128 * 2]


def test_registered_everywhere_the_space_looks():
    assert experiment.kernel_class(tma()) is TmaForwardSm120
    assert issubclass(TmaForwardSm120, TunedForwardSm120)
    assert forward_kernels()["sm120_tma"] is TmaForwardSm120 and "sm120_tma" in forward_domain()["kernel"]


def test_space_enumerates_tma_configs():
    feasible = feasible_forward(D128_CAUSAL, TARGET)
    tma_configs = [c for c in feasible if c.kernel == "sm120_tma"]
    assert {c.num_stages for c in tma_configs} == set(FORWARD_DOMAIN["num_stages"])
    assert tma() in tma_configs and tma(num_stages=1) in tma_configs
    # every feasible TMA config fits the target with its barriers
    assert all(forward_smem_bytes(c, D128_CAUSAL)[0] <= TARGET.smem_per_block for c in tma_configs)


def test_tma_shared_memory_counts_barriers():
    smem, breakdown = TmaForwardSm120.smem_bytes(tma(), D128)
    assert smem == 98304 + 40 and "Q 32768 + K 32768 + V 32768 + 40 B of mbarriers" in breakdown
    assert forward_smem_bytes(tma(), D128) == (smem, breakdown)
    assert forward_smem_bytes(ForwardConfig(128, 64, 128, 2), D128)[0] == 98304  # the cp.async kernel: tiles only
    # Q_in_regs: V shares Q's buffer, as upstream's
    assert TmaForwardSm120.smem_bytes(tma(num_stages=1, Q_in_regs=True), D128)[0] == 32768 + 16384 + 24


def test_barriers_alone_can_break_the_budget():
    # tiles of exactly 101376 B: the cp.async kernel fits, the TMA kernel's 3 mbarriers (24 B) do not
    pc = ProblemClass(96, 96, False)
    cp_async = ForwardConfig(tile_m=48, tile_n=240, num_threads=96, num_stages=1)
    assert forward_smem_bytes(cp_async, pc)[0] == TARGET.smem_per_block and check_forward(cp_async, pc, TARGET)
    verdict = check_forward(ForwardConfig(48, 240, 96, 1, kernel="sm120_tma"), pc, TARGET)
    assert verdict.rule == "smem_capacity"
    assert "needs 101400 B" in verdict.message and "24 B of mbarriers" in verdict.message and "101376 B" in verdict.message


def test_over_99k_rejected_with_rule_and_numbers():
    verdict = check_forward(tma(tile_n=128), D128, TARGET)
    assert verdict.rule == "smem_capacity"
    assert "163880 B" in verdict.message and "101376 B" in verdict.message


@pytest.mark.parametrize("stages", [None, 0, 5, True, "2"])
def test_missing_or_invalid_stage_count_rejected(stages):
    verdict = check_forward(tma(num_stages=stages), D128, TARGET)
    assert verdict.rule == "num_stages_domain" and "'sm120_tma'" in verdict.message and repr(stages) in verdict.message


def test_unknown_kernel_class_rejected():
    verdict = check_forward(ForwardConfig(kernel="sm120_wgmma"), D128, TARGET)
    assert verdict.rule == "kernel_known"
    assert "'sm120_wgmma'" in verdict.message and "sm120_tma" in verdict.message


def test_q_in_regs_keeps_one_stage_for_tma():
    verdict = check_forward(tma(num_stages=2, Q_in_regs=True), D128, TARGET)
    assert verdict.rule == "Q_in_regs_one_stage"


def test_the_fp16_entrys_kernel_reads_the_thread_index_once(tmp_path):
    # the lowering re-read %tid.x in fp16's mainloop and rebuilt the K tile's address from it before every block
    # (3 reads in this kernel, 6 in the longest-first one; bf16: 1): docs/measurements/2026-12-06-fp16-sass-address-remat.md.
    # bf16 traces as before (its PTX is byte-identical, by bench/ptx_dump.py's diff in that record)
    name = "tma_trimmed_64x64_qr_prefill_gqa4"  # the fp16 GQA 4 entry on its models-suite shape
    done = subprocess.run([sys.executable, "bench/ptx_dump.py", str(tmp_path), "--configs", name, "--dtype", "fp16"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    ptx = (tmp_path / f"{name}.ptx").read_text()
    assert ptx.count("%tid.x") == 1
    assert re.search(r"// begin inline asm\n\s*mov.u32 %r\d+, %r\d+;", ptx)  # the index through opaque_i32
