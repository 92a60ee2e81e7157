"""The one-kernel cluster decode (kernels/decode_cluster_forward_sm120.py, kernel="sm120_decode_cluster"): registered
but not searched and in no dispatch entry (measured slower than the split-KV entry on every decode:
docs/measurements/2026-12-04-h200-decode-cluster.md), its rules named before any compile, its shared
memory under SM120's 99 KB, and (compile-marked) the sm_120a build through the static check: its storage as declared,
one CTA per SM. Its arithmetic is checked on the GPU (bench/gpu_lpt.py --configs 16x64x256:dc, the gate over the
matrix's one-token problems; bench/gpu_decode_floor.py --decode-cluster), its layout algebra in
tests/test_decode_cluster_layout.py.
"""

from pathlib import Path

import pytest

import experiment
from fa4tune.config import ForwardConfig, Problem, ProblemClass
from fa4tune.feasibility import check_forward, check_forward_problem
from fa4tune.kernel_class import forward_kernels
from fa4tune.static_check import StaticJob, run_static
from fa4tune.targets import get_target
from kernels.decode_cluster_forward_sm120 import DecodeClusterForwardSm120
from search.space import get_space

ROOT = Path(__file__).resolve().parent.parent
TARGET = get_target("sm120")
CONFIG = ForwardConfig(16, 64, 256, 1, False, kernel="sm120_decode_cluster")
DECODE = ProblemClass(128, 128, False, 4, "bf16", "decode")

pytestmark = pytest.mark.usefixtures("this_experiment")  # tests/conftest.py


def decode(seqlen_q=1, seqlen_k=4096, heads=32, heads_kv=8, head_dim=128, causal=False, dtype="bf16"):
    return Problem(1, seqlen_q, seqlen_k, heads, heads_kv, head_dim, head_dim, causal, dtype, backward=False)


def test_registered_not_searched_and_in_no_entry():
    assert forward_kernels(experiment)["sm120_decode_cluster"] is DecodeClusterForwardSm120
    assert DecodeClusterForwardSm120.searched is False
    assert "sm120_decode_cluster" not in get_space("fwd").domain["kernel"]
    for regime in ("decode", "chunked", "prefill"):
        pc = ProblemClass(128, 128, regime == "chunked", 4, "bf16", regime)
        assert experiment.forward_config(pc).kernel != "sm120_decode_cluster", pc.name


def test_one_token_d128_bf16_up_to_eight_query_heads_per_kv_head():
    assert check_forward(CONFIG, DECODE, TARGET)
    smem, breakdown = DecodeClusterForwardSm120.smem_bytes(CONFIG, DECODE)
    assert smem == 8 * 12288 + 8 * 256 <= TARGET.smem_per_block, breakdown
    for heads, heads_kv in ((32, 8), (8, 8), (64, 8)):  # GQA 4, 1 (MHA) and 8
        assert check_forward_problem(CONFIG, decode(heads=heads, heads_kv=heads_kv), TARGET)
    assert check_forward_problem(CONFIG, decode(seqlen_k=4095, causal=True), TARGET)  # sk no tile multiple, causal


@pytest.mark.parametrize("config,problem,rule", [
    (CONFIG, decode(seqlen_q=2), "seqlen_q_domain"),
    (CONFIG, decode(seqlen_q=8), "seqlen_q_domain"),
    (CONFIG, decode(head_dim=64), "head_dim_domain"),
    (CONFIG, decode(head_dim=96), "head_dim_domain"),
    (CONFIG, decode(heads=128, heads_kv=8), "decode_cluster_query_rows"),
    (CONFIG, decode(dtype="fp16"), "decode_cluster_dtype"),
    (ForwardConfig(32, 64, 256, 1, False, kernel="sm120_decode_cluster"), decode(), "decode_cluster_tile"),
    (ForwardConfig(16, 64, 128, 1, False, kernel="sm120_decode_cluster"), decode(), "num_threads_domain"),
    (ForwardConfig(16, 64, 256, 2, False, kernel="sm120_decode_cluster"), decode(), "num_stages_domain"),
])
def test_what_it_cannot_run_is_refused_by_a_named_rule(config, problem, rule):
    verdict = check_forward_problem(config, problem, TARGET)
    assert not verdict and verdict.rule == rule, verdict
    assert "sm120_decode_cluster" in verdict.message  # the rule's message names the kernel and the value


def test_static_shape_is_a_4k_decode_step():
    shape = DecodeClusterForwardSm120.static_problem(DECODE)
    assert (shape.seqlen_q, shape.seqlen_k, shape.num_heads, shape.num_heads_kv) == (1, 4096, 32, 8)
    assert check_forward_problem(CONFIG, shape, TARGET)


@pytest.mark.compile
def test_builds_for_sm120a_one_cta_per_sm(tmp_path):
    (facts,) = run_static([StaticJob("fwd", CONFIG, DECODE)], TARGET, ROOT / "experiment.py", workers=1,
                          cache_path=tmp_path / "facts.jsonl")
    assert facts.status == "ok", facts.reason
    assert facts.dynamic_smem_bytes == facts.declared_smem_bytes == 8 * 12288 + 8 * 256
    assert facts.registers * 256 <= 64 * 1024 and facts.blocks_per_sm == 1
    # Recorded 2026-12-04 (flash-attn-4 4.0.0b36, nvidia-cutlass-dsl 4.8.1): 255 registers, 8 B spilled and reloaded
    # (160 of them hold a tile's K and V in flight); a blow-up past a few words would show here
    assert facts.spill_store_bytes <= 64 and facts.spill_load_bytes <= 64, facts


def test_the_gpu_gate_bench_runs_it_on_the_one_token_problems():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_lpt", ROOT / "bench" / "gpu_lpt.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    (config,) = bench.parse_configs("16x64x256:dc")
    assert config == CONFIG
    extra = bench.one_token_problems([config])
    assert bench.one_token_problems([bench.parse_configs("64x96x128:q")[0]]) == []
    assert all(check_forward_problem(CONFIG, p, TARGET) for p in extra)
    seqlens = sorted(p.seqlen_k for p in extra)
    assert seqlens[0] < 8 and any(s % 16 for s in seqlens) and seqlens[-1] > 8 * 2 * 512  # empty CTAs, partial groups, tiles
    assert {p.num_heads // p.num_heads_kv for p in extra} == {1, 4, 8} and {p.causal for p in extra} == {False, True}
