"""bench/dropin_gpu.py (issue 69's GPU checks): its models' rows are the window and softcap classes they claim, and a
bad step name is one line and exit 2 (the steps themselves need a GPU: docs/measurements/data/2026-12-07-gpu-issue69.sh)."""

import torch

import experiment
from bench import dropin_gpu
from fa4tune.config import Problem
from fa4tune.harness import gate


def test_the_models_rows_are_window_and_softcap_classes():
    names = []
    for label, batch, seqlen, heads, heads_kv, head_dim, left, softcap, source in dropin_gpu.MODELS:
        problem = Problem(batch, seqlen, seqlen, heads, heads_kv, head_dim, head_dim, True, window_size_left=left,
                          window_size_right=0 if left >= 0 else -1, softcap=softcap)
        names.append(problem.problem_class.name)
        assert "config.json" in source
    assert names == ["d128-causal-gqa4-window-bf16", "d256-causal-gqa2-window-softcap-bf16",
                     "d256-causal-gqa2-softcap-bf16", "d256-causal-gqa2-window-bf16",
                     "d128-causal-gqa2-window-softcap-bf16", "d128-causal-gqa2-softcap-bf16",
                     "d128-causal-gqa2-window-bf16", "d128-causal-gqa4-window-bf16"]


def test_the_local_step_s_configs_run_their_window_classes_so_no_gpu_minute_goes_to_a_refusal():
    """Every (problem, window, kernel) the local step gates and every TMA config it times is feasible on SM120 for the
    class it runs; the windows include a right side (not causal) and a soft-cap case."""
    from fa4tune.feasibility import check_forward_entry
    from fa4tune.targets import get_target

    classes = set()
    for label, batch, sq, sk, heads, heads_kv, head_dim, softcap in dropin_gpu.LOCAL_GATE:
        for left, right in dropin_gpu.LOCAL_WINDOWS:
            problem = Problem(batch, sq, sk, heads, heads_kv, head_dim, head_dim, right == 0, window_size_left=left,
                              window_size_right=right, softcap=softcap)
            pc = problem.problem_class
            assert pc.window, (label, left, right)
            classes.add(pc.name)
            for kernel, stages, q_in_regs in dropin_gpu.LOCAL_GATED[head_dim]:
                config = experiment.ForwardConfig(tile_m=64, tile_n=32 if head_dim > 128 else 64, num_threads=128,
                                                  num_stages=stages, Q_in_regs=q_in_regs, kernel=kernel)
                assert check_forward_entry(config, pc, get_target()), (pc.name, kernel)
    assert any("softcap" in name for name in classes) and any("noncausal" in name for name in classes)
    for label, batch, seqlen, heads, heads_kv, head_dim, left in dropin_gpu.LOCAL_TIMED:
        pc = Problem(batch, seqlen, seqlen, heads, heads_kv, head_dim, head_dim, True, window_size_left=left,
                     window_size_right=0).problem_class
        assert pc.window
        for kernel, tile_m, stages, q_in_regs in dropin_gpu.LOCAL_TIMED_CONFIGS:
            config = experiment.ForwardConfig(tile_m=tile_m, tile_n=64, num_threads=128, num_stages=stages,
                                              Q_in_regs=q_in_regs, kernel=kernel)
            assert check_forward_entry(config, pc, get_target()), (label, kernel, tile_m)
    assert sum(len(kernels) for kernels in dropin_gpu.LOCAL_GATED.values()) <= 7  # ~14 compiles in one process


def test_the_softcap_step_times_gemma_2_27b_s_classes_on_configs_sm120_accepts():
    """The soft-cap step's layers are the two Gemma 2 27B classes the studies tuned, and every config it times runs
    them within SM120's rules (a refused one would be a printed row, not a timing)."""
    from fa4tune.feasibility import check_forward_entry
    from fa4tune.targets import get_target

    names = set()
    for label, (batch, seqlen, heads, heads_kv, head_dim), left in dropin_gpu.SOFTCAP_TIMED:
        pc = Problem(batch, seqlen, seqlen, heads, heads_kv, head_dim, head_dim, True, window_size_left=left,
                     window_size_right=0 if left >= 0 else -1, softcap=50.0).problem_class
        names.add(pc.name)
        for name, fields in dropin_gpu.SOFTCAP_CONFIGS:
            assert check_forward_entry(experiment.ForwardConfig(**fields), pc, get_target()), (label, name)
    assert names == {"d128-causal-gqa2-window-softcap-bf16", "d128-causal-gqa2-softcap-bf16"}
    assert dropin_gpu.STEPS["softcap"] is dropin_gpu.softcap_step


def test_the_window_decode_step_runs_the_split_class_on_every_window_and_the_suite_s_window_decodes():
    """Every (case, window, splits) the window-decode step gates is a window class the decode entry's split-KV config
    runs within SM120's rules (pages too); its timed rows are the models suite's window decodes."""
    import dataclasses

    from fa4tune.feasibility import check_forward_entry, check_forward_problem
    from fa4tune.suites import load_suite
    from fa4tune.targets import get_target

    assert experiment.ForwardConfig(**dropin_gpu.SPLIT_DECODE, extra={"num_splits": 0}) == experiment.DECODE
    cases = dropin_gpu.window_decode_cases()
    for label, problem, splits in cases:
        config = dataclasses.replace(experiment.DECODE, extra={"num_splits": splits})
        pc = problem.problem_class
        assert (pc.window or pc.softcap) and check_forward_problem(config, problem, get_target()), (label, problem)
    assert {splits for *_, splits in cases} >= {0, 2, 4}  # the heuristic's, and forced splits up to a window's blocks
    assert {problem.page_size for _, problem, _ in cases} == {0, *dropin_gpu.WINDOW_DECODE_PAGES}
    assert any(not problem.causal for _, problem, _ in cases)
    softcapped = [problem.problem_class for _, problem, _ in cases if problem.softcap]
    assert softcapped and any(pc.window for pc in softcapped) and any(not pc.window for pc in softcapped)
    suite = {(p.batch, p.seqlen_k, p.num_heads, p.num_heads_kv, p.head_dim, p.window_size_left, p.softcap)
             for p in load_suite("models") if p.seqlen_q == 1 and (p.problem_class.window or p.problem_class.softcap)}
    assert {row[1:] for row in dropin_gpu.WINDOW_DECODE_TIMED} == suite
    for label, batch, seqlen_k, heads, heads_kv, head_dim, left, softcap in dropin_gpu.WINDOW_DECODE_TIMED:
        pc = Problem(batch, 1, seqlen_k, heads, heads_kv, head_dim, head_dim, True, window_size_left=left,
                     window_size_right=0 if left >= 0 else -1, softcap=softcap).problem_class
        assert check_forward_entry(experiment.DECODE, pc, get_target()), label  # timed, not refused


def test_a_bad_step_is_one_line_and_exit_2(capsys):
    assert dropin_gpu.main(["nope"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_the_kv_cache_rows_are_decodes_whose_entry_or_split_count_runs_the_split_kv_class():
    for label, batch, slots, heads, heads_kv, head_dim, lengths, splits in dropin_gpu.KV_CACHES:
        pc = Problem(batch, 1, slots, heads, heads_kv, head_dim, head_dim, True, backward=False).problem_class
        assert pc.regime == "decode" and (lengths is None or (len(lengths) == batch and max(lengths) <= slots))
        assert splits > 1 or experiment.TABLES.forward_config(pc).kernel == "sm120_splitkv", label


def _kv_cache(used):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, n, 4, 64, generator=g).bfloat16() for n in (1, 96, 96))
    used = torch.tensor(used, dtype=torch.int32)
    out = torch.cat([gate.reference_attention(q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n], True).out
                     for b, n in enumerate(used.tolist())]).bfloat16()
    return out, q, k, v, used


SPLIT_LINE = "fa4tune: tuned forward d64-causal-gqa2-decode-bf16: tile_m=32 kernel=sm120_splitkv (runs its own entry)"


def test_the_kv_cache_check_passes_the_split_class_on_each_sequence_s_used_keys(capsys):
    assert dropin_gpu.kv_cache_failures("case", *_kv_cache([5, 96]), [SPLIT_LINE]) == 0
    assert "used [5, 96]" in capsys.readouterr().out


def test_the_kv_cache_check_fails_another_class_or_the_whole_cache_s_keys():
    out, q, k, v, used = _kv_cache([5, 96])
    assert dropin_gpu.kv_cache_failures("case", out, q, k, v, used, ["fa4tune: tuned forward x: kernel=sm120 (...)"]) == 1
    assert dropin_gpu.kv_cache_failures("case", out, q, k, v, used, []) == 1  # no tuned forward ran (upstream's did)
    whole, *_ = _kv_cache([96, 96])  # attention over every slot, not the used ones: the first sequence is off
    assert dropin_gpu.kv_cache_failures("case", whole, q, k, v, used, [SPLIT_LINE]) == 1
