"""The split-KV forward class (experiment.py's sm120_splitkv, issue #13): registered with its num_splits knob in the
search space, its split heuristic, its per-problem rules (named, with the numbers) before any compile, the host
path's split hooks, and (compile-marked) sm_120a compiles of decode and chunked-prefill shapes that run split, with
their shared storage equal to the declared formula and no spills."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

import experiment
from kernels.splitkv_forward_sm120 import SplitKvForwardSm120, ctas_per_sm, split_kv_heuristic
from fa4tune.config import ForwardConfig, Problem, ProblemClass
from fa4tune.fake_compile import STATIC_SEQLEN, static_shape
from fa4tune.feasibility import check_forward, check_forward_problem
from fa4tune.kernel_class import forward_kernels
from fa4tune.sm120_interface import FORWARD_EDITS
from fa4tune.suites import load_suite
from fa4tune.targets import get_target
from kernels.tuned_forward_sm120 import TunedForwardSm120
from search.space import forward_space

ROOT = Path(__file__).resolve().parent.parent
TARGET = get_target("sm120")
GQA4 = ProblemClass(128, 128, False, 4)
GQA4_CAUSAL = ProblemClass(128, 128, True, 4)


def split_config(tile_m=16, tile_n=64, num_threads=32, num_stages=1, num_splits=0, **kw):
    return ForwardConfig(tile_m=tile_m, tile_n=tile_n, num_threads=num_threads, num_stages=num_stages,
                         kernel="sm120_splitkv", extra={"num_splits": num_splits}, **kw)


def decode(batch=1, seqlen_k=4096, seqlen_q=1, causal=False, head_dim=128, gqa=4, **kw):
    return Problem(batch, seqlen_q, seqlen_k, 8 * gqa, 8, head_dim, head_dim, causal, backward=False, **kw)


# ---- registration and the search space ----

def test_registered_under_its_name_with_num_splits_in_the_search_space():
    assert forward_kernels(experiment)["sm120_splitkv"] is SplitKvForwardSm120
    assert experiment.kernel_class(split_config()) is SplitKvForwardSm120
    assert SplitKvForwardSm120.knobs["num_splits"][0] == 0  # the heuristic is a value the search can pick
    space = forward_space(forward_kernels(experiment))
    assert "num_splits" in space.distributions()
    assert space.kernel_knobs["sm120_splitkv"] == ("num_splits",)
    feasible = [c for c in space.feasible(GQA4, TARGET) if c.kernel == "sm120_splitkv"]
    # the search proposes entries, and an entry runs its class's shortest problem (one KV block): the heuristic or 1
    assert {c.extra_knobs["num_splits"] for c in feasible} == {0, 1}
    assert all(check_forward(dataclasses.replace(c, extra={"num_splits": n}), GQA4, TARGET, forward_kernels(experiment))
               for c in feasible[:5] for n in SplitKvForwardSm120.knobs["num_splits"])  # every count is a valid config
    # the decode tiles (16 rows, one warp) are outside the shared FORWARD_DOMAIN (tile_m >= 64, 128/256 threads),
    # so the search does not propose them yet; the rules accept them, so a dispatch entry can carry them
    assert not any(c.tile_m == 16 for c in feasible)
    assert check_forward(split_config(), GQA4, TARGET, forward_kernels(experiment))


@pytest.mark.parametrize("q_in_regs", [False, True])
def test_the_last_stages_v_goes_with_the_prologue_unless_q_shares_its_buffer(q_in_regs):
    """V_ahead: the prologue sends the last stage's V too, except with Q_in_regs, where that V buffer holds Q until Q
    is in registers (a V load there would overwrite Q before every thread has read it)."""
    import cutlass

    kernel = SplitKvForwardSm120(cutlass.BFloat16, 128, 128, 4, tile_m=32, tile_n=64, num_stages=2, num_threads=64,
                                 Q_in_regs=q_in_regs, num_splits=0)
    assert kernel.V_ahead is (not q_in_regs)


def test_shared_memory_formula_is_upstreams_tiles():
    cfg = split_config(num_stages=2)
    assert SplitKvForwardSm120.smem_bytes(cfg, GQA4) == TunedForwardSm120.smem_bytes(cfg, GQA4)
    assert SplitKvForwardSm120.smem_bytes(cfg, GQA4)[0] == 4096 + 2 * 32768  # Q 16x128, K and V 64x128 x 2 stages


def test_other_classes_do_not_split_and_keep_the_default_static_shape():
    cfg = ForwardConfig()
    assert TunedForwardSm120.num_splits_for(cfg, decode(), 170) == 1
    assert static_shape(GQA4, TunedForwardSm120).seqlen_q == STATIC_SEQLEN
    assert static_shape(GQA4).seqlen_k == STATIC_SEQLEN


def test_static_check_compiles_the_shape_of_the_class_regime():
    """The static facts are those of the kernel the class's problems run: split for a decode and a chunked prefill,
    unsplit for a prefill (whose problems have more query tiles than CTA slots)."""
    decode_class = dataclasses.replace(GQA4, regime="decode")
    shape = static_shape(decode_class, SplitKvForwardSm120)
    assert (shape.seqlen_q, shape.seqlen_k, shape.num_heads, shape.num_heads_kv) == (1, 4096, 32, 8)
    chunked = static_shape(dataclasses.replace(GQA4_CAUSAL, regime="chunked"), SplitKvForwardSm120)
    assert (chunked.seqlen_q, chunked.seqlen_k, chunked.causal) == (512, 8192, True)
    for pc in (GQA4, GQA4_CAUSAL):
        prefill = static_shape(pc, SplitKvForwardSm120)
        assert (prefill.seqlen_q, prefill.seqlen_k, prefill.num_heads_kv, prefill.causal) == (8192, 8192, 16, pc.causal)
    assert SplitKvForwardSm120.num_splits_for(split_config(32, 64, 64, 2), shape, 170) > 1
    mha_chunked = static_shape(ProblemClass(128, 128, True, 1, regime="chunked"), SplitKvForwardSm120)
    assert SplitKvForwardSm120.num_splits_for(split_config(64, 64, 128, 2), mha_chunked, 170) > 1


@pytest.mark.parametrize("num_sms", [170, 188])  # RTX 5090, RTX PRO 6000
def test_the_prefill_static_shape_runs_unsplit_for_every_config_of_the_space(num_sms):
    space = forward_space(forward_kernels(experiment))
    checked = 0
    for gqa in (1, 4, 8):
        for causal in (False, True):
            pc = ProblemClass(128, 128, causal, gqa)
            shape = static_shape(pc, SplitKvForwardSm120)
            for cfg in space.feasible(pc, TARGET):
                if cfg.kernel == "sm120_splitkv" and cfg.extra_knobs["num_splits"] == 0:
                    assert SplitKvForwardSm120.num_splits_for(cfg, shape, num_sms) == 1, cfg
                    checked += 1
    assert checked > 0


# ---- the heuristic ----

def test_heuristic_fills_the_slots_once_with_splits_of_at_least_two_blocks():
    # 340 // 8 = 42 fills one wave, but 42 splits of ceil(1024 / 42) = 25 blocks need only 41 of them
    assert split_kv_heuristic(total_mblocks=8, num_n_blocks=1024, slots=340) == 41
    assert split_kv_heuristic(total_mblocks=8, num_n_blocks=64, slots=340) == 32  # 64 blocks / 2 per split
    assert split_kv_heuristic(total_mblocks=64, num_n_blocks=1024, slots=340) == 5  # 320 CTAs, not 6 x 64 = 384
    assert split_kv_heuristic(total_mblocks=1, num_n_blocks=10**6, slots=10**4) == 128  # the knob's largest value
    assert split_kv_heuristic(total_mblocks=400, num_n_blocks=1024, slots=340) == 1  # already more than a wave
    assert split_kv_heuristic(total_mblocks=8, num_n_blocks=3, slots=340) == 1  # too short to split
    assert split_kv_heuristic(total_mblocks=0, num_n_blocks=64, slots=340) == 1


def test_heuristic_leaves_no_split_empty():
    # the GQA 8 decode at 16K: 4 m blocks on 132 slots would be 33 splits of 8 blocks, the 33rd empty
    assert split_kv_heuristic(total_mblocks=4, num_n_blocks=256, slots=132) == 32
    assert split_kv_heuristic(total_mblocks=4, num_n_blocks=256, slots=264) == 64  # 66 splits of 4 blocks: 64 are enough
    for blocks in range(4, 300):
        for slots in (132, 264, 340):
            splits = split_kv_heuristic(total_mblocks=4, num_n_blocks=blocks, slots=slots)
            per_split = -(-blocks // splits)
            unrounded = min(slots // 4, blocks // 2, 128)
            assert (splits - 1) * per_split < blocks  # the last split has a block
            assert splits <= unrounded and per_split == -(-blocks // unrounded)  # as long as before, never more CTAs


def test_ctas_per_sm_by_shared_memory_threads_and_registers():
    assert ctas_per_sm(SplitKvForwardSm120, split_config(), GQA4, TARGET) == 2  # 36 KB + 1 KB reserved of 100 KB
    assert ctas_per_sm(SplitKvForwardSm120, split_config(num_stages=2), GQA4, TARGET) == 1
    # 256 threads at 255 registers: 65536 // (256 * 255) = 1, although 36 KB would fit twice
    small = split_config(tile_m=128, tile_n=16, num_threads=256)
    assert SplitKvForwardSm120.smem_bytes(small, GQA4)[0] < 50000
    assert ctas_per_sm(SplitKvForwardSm120, small, GQA4, TARGET) == 1


def test_num_splits_for_decode_prefill_and_an_explicit_knob():
    cfg = split_config()  # 16x64, 1 warp, 1 stage: 2 CTAs per SM on 170 SMs = 340 slots
    assert SplitKvForwardSm120.num_splits_for(cfg, decode(seqlen_k=4096), 170) == 32  # 8 KV heads x 1 m block
    assert SplitKvForwardSm120.num_splits_for(cfg, decode(seqlen_k=65536), 170) == 41  # 340 // 8 = 42 splits of 25 blocks: 41 hold them all
    assert SplitKvForwardSm120.num_splits_for(cfg, decode(batch=8, seqlen_k=65536), 170) == 5
    prefill = Problem(1, 8192, 8192, 32, 8, 128, 128, True, backward=False)
    assert SplitKvForwardSm120.num_splits_for(split_config(128, 64, 128), prefill, 170) == 1
    assert SplitKvForwardSm120.num_splits_for(split_config(num_splits=16), decode(), 170) == 16


# ---- bad input: the named rule before any compile ----

def test_a_window_s_splits_divide_the_blocks_its_first_query_tile_reaches():
    """A window decode reads the window's keys, not the cache's: its KV blocks (and so the heuristic's splits) are those
    of window + query tile + the block its left edge cuts; a window wider than the cache changes nothing."""
    config = split_config(32, 64, 64, 2)
    mistral = decode(batch=16, seqlen_k=16384, causal=True, window_size_left=4096)
    assert SplitKvForwardSm120.num_n_blocks(config, mistral) == -(-(4096 + 1 + 64) // 64) == 66
    assert SplitKvForwardSm120.num_n_blocks(config, decode(seqlen_k=16384, causal=True)) == 256
    wide = decode(seqlen_k=1000, causal=True, window_size_left=5000)
    assert SplitKvForwardSm120.num_n_blocks(config, wide) == SplitKvForwardSm120.num_n_blocks(config, decode(seqlen_k=1000))
    gemma3 = decode(seqlen_k=32768, causal=True, gqa=2, window_size_left=1024)
    assert SplitKvForwardSm120.num_splits_for(config, gemma3, 170) < SplitKvForwardSm120.num_splits_for(
        config, decode(seqlen_k=32768, causal=True, gqa=2), 170)
    window_decode = ProblemClass.parse("d128-causal-gqa4-window-decode-bf16")
    assert check_forward(config, window_decode, TARGET)
    assert static_shape(window_decode, SplitKvForwardSm120).window_size_left == 1024  # the static check compiles is_local


def test_num_splits_above_the_kv_blocks_is_refused_with_the_numbers():
    cfg = split_config(tile_n=128, num_splits=16)
    verdict = check_forward_problem(cfg, decode(seqlen_k=1000), TARGET, forward_kernels(experiment))
    assert verdict.rule == "num_splits_le_kv_blocks"
    assert "num_splits=16" in verdict.message and "8 KV blocks" in verdict.message and "seqlen_k=1000" in verdict.message
    assert check_forward_problem(split_config(tile_n=128, num_splits=8), decode(seqlen_k=1000), TARGET, forward_kernels(experiment))


def test_causal_with_more_queries_than_keys_is_refused():
    verdict = check_forward_problem(split_config(64, 64, 128), decode(seqlen_q=512, seqlen_k=256, causal=True), TARGET,
                                    forward_kernels(experiment))
    assert verdict.rule == "causal_seqlen_q_le_seqlen_k"
    assert "seqlen_q=512" in verdict.message and "seqlen_k=256" in verdict.message
    assert check_forward_problem(split_config(64, 64, 128), decode(seqlen_q=256, seqlen_k=256, causal=True), TARGET,
                                 forward_kernels(experiment))


def test_unsupported_head_dims_and_split_values_are_refused():
    kernels = forward_kernels(experiment)
    verdict = check_forward(split_config(), ProblemClass(512, 512, False, 4), TARGET, kernels)
    assert verdict.rule == "head_dim_domain" and "got 512" in verdict.message
    assert check_forward(split_config(), ProblemClass(32, 32, False, 4), TARGET, kernels).rule == "head_dim_domain"
    verdict = check_forward(split_config(num_splits=7), GQA4, TARGET, kernels)
    assert verdict.rule == "kernel_knobs" and "got 7" in verdict.message
    for head_dim in (64, 96, 128):
        assert check_forward(split_config(), ProblemClass(head_dim, head_dim, False, 4), TARGET, kernels)
    # d256 (Gemma's decodes): within the limits, where its tiles fit 99 KB (32x64 in two stages does not)
    assert check_forward(split_config(32, 32, 64), ProblemClass(256, 256, True, 2, regime="decode"), TARGET, kernels)


def test_decode_suite_is_forward_only_gqa_decode_and_a_causal_chunked_prefill():
    problems = load_suite("decode")
    decodes = [p for p in problems if p.seqlen_q == 1 and not p.page_size]
    assert sorted((p.batch, p.seqlen_k) for p in decodes) == [(1, 4096), (1, 16384), (1, 65536), (8, 4096), (8, 16384), (8, 65536)]
    assert all((p.num_heads, p.num_heads_kv, p.head_dim, p.backward) == (32, 8, 128, False) for p in problems)
    (chunk,) = [p for p in problems if p.seqlen_q > 1 and not p.page_size]
    assert (chunk.seqlen_q, chunk.seqlen_k, chunk.causal) == (512, 8192, True)
    # issue 71's paged caches: the batch 8 decode at 16K and the long context at pages of 16 and 256, a paged chunk
    paged = sorted((p.batch, p.seqlen_q, p.seqlen_k, p.page_size) for p in problems if p.page_size)
    assert paged == [(1, 1, 65536, 16), (1, 1, 65536, 256), (1, 512, 8192, 16), (8, 1, 16384, 16), (8, 1, 16384, 256)]
    for p in problems:  # the split class accepts every problem of the suite
        assert check_forward_problem(split_config(64, 64, 128, 2), p, TARGET, forward_kernels(experiment))


# ---- the host path ----

def test_host_path_asks_the_class_for_splits_and_lets_split_classes_through():
    edits = {what: new for _, new, what in FORWARD_EDITS}
    assert "config = _fa4tune_fwd_config(sm120_config, config" in edits["forward num_splits"]
    from fa4tune.sm120_interface import build

    host = build(experiment.kernel_class)  # every edit matched the pinned upstream source once
    assert "_fa4tune_fwd_config" in host.flash_attn_fwd.__globals__


# ---- compiles (sm_120a, fake tensors) ----

def probe(jobs, tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "splitkv_probe.py"), str(tmp_path)], input=json.dumps(jobs),
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def pdl_probe(job, arch, tmp_path) -> dict:
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "pdl_probe.py"), str(tmp_path / arch), arch],
                          input=json.dumps(job), capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_120a", "sm_90a"])
def test_the_combine_is_a_programmatic_dependent_launch(arch, tmp_path):
    """For SM120 and for the H200 that emulates it: the split kernel triggers its dependents, the combine compiles as
    fa4tune's PDL launch (COMBINE_PDL, the default) and upstream's stream-ordered one is not used."""
    facts = pdl_probe({"config": split_config().to_dict(), "problem": decode().to_dict()}, arch, tmp_path)
    assert facts["kernel_ptx"] >= 1 and facts["triggers_dependents"] is True
    assert (facts["pdl_combines"], facts["plain_combines"]) == (1, 0)


@pytest.mark.compile
def test_decode_and_chunked_prefill_compile_split_without_spills(tmp_path):
    jobs = [
        {"config": split_config().to_dict(), "problem": decode(softcap=50.0).to_dict()},  # heuristic: 32 splits, soft-cap
        # Mistral 7B's window decode (4096 keys of 16384): the window kernel (is_local), its splits over the window
        {"config": split_config(64, 64, 128, 2).to_dict(),
         "problem": decode(batch=8, seqlen_k=16384, causal=True, window_size_left=4096).to_dict()},
        {"config": split_config(64, 64, 128, 2, num_splits=4).to_dict(),
         "problem": decode(seqlen_q=512, seqlen_k=8192, causal=True).to_dict()},
    ]
    first, second, chunk = probe(jobs, tmp_path)
    assert first["splits"] == 32 and first["split_kv_compiled"] == [True]
    assert second["splits"] > 1 and second["split_kv_compiled"] == [True] and second["local_compiled"] == [True]
    assert first["local_compiled"] == chunk["local_compiled"] == [False]
    assert first["score_mod_compiled"] == [True] and second["score_mod_compiled"] == chunk["score_mod_compiled"] == [False]
    assert chunk["splits"] == 4 and chunk["split_kv_compiled"] == [True]
    assert first["combine"] and all(c["spill_store_bytes"] == 0 for c in first["combine"])  # upstream's combine, sm_120a
    for facts in (first, second, chunk):
        # the static check's smem_understated rule: the compiled shared storage equals the declared formula
        assert facts["dynamic_smem_bytes"] == facts["declared_smem_bytes"] > 0
        assert facts["spill_store_bytes"] == 0 and facts["stack_bytes"] == 0
        assert facts["registers"] <= 255


@pytest.mark.compile
def test_a_kv_cache_decode_with_seqused_k_compiles_the_split_class_reading_the_lengths(tmp_path):
    """The drop-in's call with seqused_k (a KV cache of 8192 slots, sequences of 100 to 8192 used keys): the decode
    class's own entry (sm120_splitkv) runs it, its kernel compiles split for sm_120a with SeqlenInfoQK reading the used
    lengths, without spills; the combine is the same as without them."""
    problem = decode(batch=4, seqlen_k=8192, causal=True)
    (report,) = probe([{"problem": problem.to_dict(), "seqused_k": [100, 4000, 8192, 1]}], tmp_path)
    entry = experiment.TABLES.forward_config(problem.problem_class)
    assert entry.kernel == "sm120_splitkv" and report["config"] == entry.to_dict()
    assert f"tuned forward {problem.problem_class.name}: {entry.short()}" in report["debug_line"]
    assert "upstream's SM120 config" not in report["debug_line"]
    assert report["splits"] > 1 and report["split_kv_compiled"] == [True] and report["seqused_k_traced"] == [True]
    assert report["spill_store_bytes"] == 0 and report["registers"] <= 255


def test_the_split_class_declares_seqused_k_and_not_what_its_code_lacks():
    from fa4tune.api import Extras
    from fa4tune.kernel_class import runs_features

    assert runs_features(SplitKvForwardSm120) == {"seqused", "paged", "learnable_sink", "local", "softcap"}  # no seqused_q
    used = object()
    assert Extras(seqused_k=used).features() == {"seqused"} and Extras(seqused_q=used).features() == {"seqused_q"}
    assert Extras().features() == set()


# ---- bench/gpu_splitkv.py's CPU parts ----

def load_gpu_bench():
    from bench_helpers import load_bench

    return load_bench("gpu_splitkv")


def test_gpu_bench_matrix_covers_the_issue_axes_with_partial_last_blocks():
    bench = load_gpu_bench()
    problems = bench.matrix_problems()
    for axis, values in (("seqlen_q", {1, 2, 8, 64, 512}), ("head_dim", {64, 96, 128}), ("batch", {1, 8})):
        for causal in (False, True):
            assert {getattr(p, axis) for p in problems if p.causal == causal} == values, (axis, causal)
    assert {p.problem_class.qhead_per_kvhead for p in problems} == {1, 4, 8}
    assert all(p.seqlen_k % 16 for p in problems)  # never a whole number of KV blocks for any tile_n
    assert all(p.seqlen_q < p.seqlen_k for p in problems if p.causal)
    configs = bench.parse_configs(bench.DEFAULT_CONFIGS)
    for cfg in configs + [dataclasses.replace(c, extra={"num_splits": bench.FORCED_SPLITS}) for c in configs]:
        for p in problems:  # every matrix row is a problem the rules accept: the gate, not a refusal, decides
            assert check_forward_problem(cfg, p, TARGET, forward_kernels(experiment)), (cfg, p)


def test_gpu_bench_configs_name_their_knobs_and_q_in_registers():
    bench = load_gpu_bench()
    plain, in_regs = bench.parse_configs("32x96x64x2:0,32x64x64x1q:4")
    assert plain == ForwardConfig(32, 96, 64, 2, False, kernel="sm120_splitkv", extra={"num_splits": 0})
    assert in_regs == ForwardConfig(32, 64, 64, 1, True, kernel="sm120_splitkv", extra={"num_splits": 4})
    assert bench.config_name(in_regs) == "sm120_splitkv 32x64 t64 s1 Q_in_regs splits=4"
    assert bench.config_name(plain) == "sm120_splitkv 32x96 t64 s2 splits=auto"


def test_gpu_bench_hbm_bound_reads_k_and_v_once():
    bench = load_gpu_bench()
    decode_4k = load_suite("decode")[0]
    ms, tflops = bench.hbm_bound(decode_4k, 4.8e12)
    kv_bytes = 2 * 4096 * 8 * 128 * 2  # K and V: seqlen_k x KV heads x head_dim x 2 bytes each
    qo_bytes = 2 * 32 * 128 * 2
    assert ms == pytest.approx((kv_bytes + qo_bytes) / 4.8e12 * 1e3)
    assert tflops == pytest.approx(4 * 32 * 4096 * 128 / ((kv_bytes + qo_bytes) / 4.8e12) / 1e12)


@dataclasses.dataclass(frozen=True)
class UpstreamFwdConfig:
    """The fields of upstream's FwdConfig the host hook reads and writes."""

    tile_m: int
    tile_n: int
    num_splits: int = 1


def test_host_hook_builds_the_problem_and_refuses_splits_the_combine_cannot_take():
    import torch

    from fa4tune.sm120_interface import UpstreamMismatch, build

    hook = build(experiment.kernel_class).flash_attn_fwd.__globals__["_fa4tune_fwd_config"]
    # (config, upstream's config, batch, seqlen_q, seqlen_k, heads, kv heads, head_dim, head_dim_v, causal, dtype, SMs),
    # as the host calls it: upstream's FwdConfig comes back with the class's split count
    chosen = UpstreamFwdConfig(16, 64)
    assert hook(split_config(), chosen, 1, 1, 4096, 32, 8, 128, 128, False, torch.bfloat16, 170).num_splits == 32
    assert hook(split_config(), chosen, 8, 1, 65536, 32, 8, 128, 128, False, torch.float16, 170).num_splits == 5
    plain = UpstreamFwdConfig(128, 64)
    assert hook(ForwardConfig(), plain, 1, 1, 4096, 32, 8, 128, 128, False, torch.bfloat16, 170) == plain  # never splits
    with pytest.raises(UpstreamMismatch, match="tile_mn no longer reaches the SM120 config"):
        hook(ForwardConfig(), UpstreamFwdConfig(128, 128), 1, 1, 4096, 32, 8, 128, 128, False, torch.bfloat16, 170)

    class NoSplits(SplitKvForwardSm120):
        @classmethod
        def num_splits_for(cls, config, problem, num_sms):
            return 0

    bad_hook = build(lambda config: NoSplits).flash_attn_fwd.__globals__["_fa4tune_fwd_config"]
    with pytest.raises(ValueError, match="num_splits_domain: NoSplits.num_splits_for gave 0 splits"):
        bad_hook(split_config(), chosen, 1, 1, 4096, 32, 8, 128, 128, False, torch.bfloat16, 170)
