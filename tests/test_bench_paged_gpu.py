"""bench/paged_gpu.py (issue 71's GPU checks): its page pools hold the contiguous cache's keys in the order their table
names, its cases are paged classes our split-KV class runs, its debug-line reading, and a bad step is one line and
exit 2 (the steps themselves need a GPU: docs/measurements/data/2026-12-07-gpu-paged.sh)."""

import dataclasses

import torch

import experiment
from bench import paged_gpu
from fa4tune.config import Problem
from fa4tune.harness import gate


def test_scattered_pages_gather_back_to_the_contiguous_cache_in_a_shuffled_order():
    cache = torch.randn(3, 256, 2, 8)
    pool, table = paged_gpu.scatter_pages(cache, 16, seed=7)
    assert pool.shape == (48, 16, 2, 8) and table.shape == (3, 16) and table.dtype == torch.int32
    assert sorted(table.flatten().tolist()) == list(range(48)) and table.flatten().tolist() != list(range(48))
    for b in range(3):
        assert torch.equal(gate.gather_pages(pool, table[b], 256), cache[b])
    again, same = paged_gpu.scatter_pages(cache * 2, 16, seed=7)
    assert torch.equal(same, table)  # K and V cut with one seed land in the same pages
    ordered, identity = paged_gpu.scatter_pages(cache, 16, seed=7, in_order=True)  # the locality control
    assert identity.flatten().tolist() == list(range(48)) and torch.equal(ordered.reshape(3, 256, 2, 8), cache)


def test_the_floor_by_head_reads_each_kv_heads_rows_of_the_pages_in_table_order():
    cache = torch.randn(2, 64, 3, 8, dtype=torch.bfloat16)  # 8 bf16 = two 8-byte words a row
    pool, table = paged_gpu.scatter_pages(cache, 16, seed=3)
    rows = table.flatten().long()
    by_head = paged_gpu.gather_by_head(pool, rows)
    assert by_head.shape == (3, 8, 16, 2) and by_head.dtype == torch.int64
    for h in range(3):  # head h's rows, sequence after sequence, are the cache's rows of head h
        assert torch.equal(by_head[h].view(torch.bfloat16).reshape(2, 64, 8), cache[:, :, h])


def test_the_cases_are_paged_classes_the_split_kv_class_runs_at_every_page_size():
    for label, batch, seqlen_q, slots, heads, kv_heads, head_dim, causal, given in paged_gpu.GATE_CASES:
        assert slots % max(paged_gpu.PAGE_SIZES) == 0, label  # contiguous and paged caches: the same keys per sequence
        assert given is None or (len(given) == batch and max(given) == slots), label
        for page in paged_gpu.PAGE_SIZES:
            problem = Problem(batch, seqlen_q, slots, heads, kv_heads, head_dim, head_dim, causal, backward=False,
                              page_size=page)
            assert experiment.TABLES.forward_config(problem.problem_class).kernel == "sm120_splitkv", (label, page)
    for label, batch, slots in paged_gpu.TIME_CASES:
        problem = Problem(batch, 1, slots, paged_gpu.HEADS, paged_gpu.KV_HEADS, paged_gpu.HEAD_DIM, paged_gpu.HEAD_DIM, True,
                          backward=False)
        pc = problem.problem_class
        # the paged decode runs the contiguous decode's entry: the timing compares the gather alone
        for page in paged_gpu.PAGE_SIZES:
            assert experiment.TABLES.forward_config(dataclasses.replace(pc, page_size=page)) == experiment.TABLES.forward_config(pc)


LINE = ("fa4tune: tuned forward d128-causal-gqa4-page16-decode-bf16: tile_m=32 tile_n=64 kernel=sm120_splitkv num_splits=0 "
        "(d128-causal-gqa4-page16-decode-bf16 runs d128-causal-gqa4-decode-bf16's entry (page size contiguous for 16))")


def test_the_debug_line_says_which_config_ran_and_whether_it_was_the_paged_class():
    assert paged_gpu.config_of(LINE) == "tile_m=32 tile_n=64 kernel=sm120_splitkv num_splits=0"
    assert paged_gpu.config_of("fa4tune: upstream's flash_attn_varlen_func: page_table with gradients") == ""
    assert paged_gpu.ran_paged(["other", LINE], 16) == LINE
    assert paged_gpu.ran_paged([LINE], 256) == ""  # another page size's class
    assert paged_gpu.ran_paged([LINE.replace("sm120_splitkv", "sm120")], 16) == ""
    assert paged_gpu.ran_paged([], 16) == ""


def test_a_bad_step_is_one_line_and_exit_2(capsys):
    assert paged_gpu.main(["nope"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
