"""The split-KV class whose splits merge on chip (experiment.py's sm120_splitkv_cluster, issue #13): registered with its
cluster sizes, run unsplit by the host (no partials, no combine), its shared-memory rule named with the numbers,
and (compile-marked) an sm_120a compile of the 4K decode: one kernel with two cluster barriers and distributed
shared memory loads, no combine, no spills, its shared storage the declared formula."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import experiment
from experiment import CLUSTER_SPLITS_DOMAIN, ClusterSplitKvForwardSm120, SplitKvForwardSm120
from fa4tune.config import ForwardConfig, Problem, ProblemClass
from fa4tune.feasibility import check_forward
from fa4tune.kernel_class import forward_kernels
from fa4tune.targets import get_target
from search.space import forward_space

ROOT = Path(__file__).resolve().parent.parent
TARGET = get_target("sm120")
GQA4 = ProblemClass(128, 128, False, 4)


def cluster_config(tile_m=32, tile_n=64, num_threads=64, num_stages=2, num_splits=8):
    return ForwardConfig(tile_m, tile_n, num_threads, num_stages, False, kernel="sm120_splitkv_cluster",
                         extra={"num_splits": num_splits})


def decode(seqlen_k=4096, seqlen_q=1, causal=False):
    return Problem(1, seqlen_q, seqlen_k, 32, 8, 128, 128, causal, backward=False)


def test_registered_with_the_portable_cluster_sizes_and_run_unsplit_by_the_host():
    kernels = forward_kernels(experiment)
    assert kernels["sm120_splitkv_cluster"] is ClusterSplitKvForwardSm120
    assert CLUSTER_SPLITS_DOMAIN == (2, 4, 8)  # 8: the portable cluster size
    space = forward_space(kernels)
    # a cluster of 2 to 8 splits needs as many KV blocks, and an entry runs its class's one-block problem too: no
    # config of it can be an entry, so the search does not draw it (searched = False; the bench scripts time it),
    # while the rules accept every cluster size as a config
    assert ClusterSplitKvForwardSm120.searched is False and "sm120_splitkv_cluster" not in space.domain["kernel"]
    assert space.check(cluster_config(), GQA4, TARGET).rule == "num_splits_le_kv_blocks"
    assert all(check_forward(cluster_config(num_splits=n), GQA4, TARGET, kernels) for n in CLUSTER_SPLITS_DOMAIN)
    for problem in (decode(), decode(65536), decode(8192, 512, causal=True)):
        assert ClusterSplitKvForwardSm120.num_splits_for(cluster_config(), problem, 170) == 1  # no partials, no combine
    assert SplitKvForwardSm120.cluster_splits == 1  # the two-kernel class keeps its grid and launch


def test_the_partial_must_fit_k_buffer_and_the_cluster_sizes_are_the_knob_domain():
    assert check_forward(cluster_config(), GQA4, TARGET, forward_kernels(experiment))
    too_big = check_forward(cluster_config(64, 32, 128, 1), GQA4, TARGET, forward_kernels(experiment))
    assert too_big.rule == "cluster_partial_fits_K_buffer"
    assert "32768 B" in too_big.message and "8192 B" in too_big.message
    for splits in (0, 16):
        verdict = check_forward(cluster_config(num_splits=splits), GQA4, TARGET, forward_kernels(experiment))
        assert verdict.rule == "kernel_knobs" and f"got {splits}" in verdict.message
    with pytest.raises(AssertionError, match="num_splits must be one of"):
        ClusterSplitKvForwardSm120(__import__("cutlass").BFloat16, 128, 128, 4, num_splits=16)


@pytest.mark.compile
def test_the_decode_compiles_to_one_kernel_with_an_on_chip_merge(tmp_path):
    job = {"config": cluster_config().to_dict(), "problem": decode().to_dict()}
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "cluster_probe.py"), str(tmp_path)], input=json.dumps(job),
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert facts["host_splits"] == 1 and facts["cluster_splits"] == [8] and facts["partials"] == [False]
    assert facts["combines"] == 0 and facts["triggers_dependents"] is False
    # one barrier after the partials are in shared memory, one before any CTA exits
    assert facts["cluster_arrives"] == 2 and facts["cluster_waits"] == 2
    assert facts["dsmem_loads"] >= 8  # each split's LSE and O read from the cluster's CTAs
    assert facts["dynamic_smem_bytes"] == facts["declared_smem_bytes"] > 0
    assert facts["spill_store_bytes"] == 0 and facts["stack_bytes"] == 0 and facts["registers"] <= 255


def test_the_gpu_bench_runs_the_cluster_class_over_the_whole_matrix():
    """bench/gpu_splitkv.py --kernel sm120_splitkv_cluster: the gated configs, and their forced 4 splits, are accepted by
    the rules on every matrix problem (the gate decides, not a refusal)."""
    from bench_helpers import load_bench

    from fa4tune.feasibility import check_forward_problem

    bench = load_bench("gpu_splitkv")
    configs = bench.matrix_configs(bench.parse_configs("32x64x64x2:8,16x64x32x2:8,64x64x128x2:2", "sm120_splitkv_cluster"))
    assert {c.kernel for c in configs} == {"sm120_splitkv_cluster"} and len(configs) == 6
    for cfg in configs:
        for problem in bench.matrix_problems():
            assert check_forward(cfg, problem.problem_class, TARGET, forward_kernels(experiment)), (cfg, problem)
            assert check_forward_problem(cfg, problem, TARGET, forward_kernels(experiment)), (cfg, problem)
