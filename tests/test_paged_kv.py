"""Paged KV caches (issue 71): the page size as a problem-class dimension, the gate's pages (a shuffled page table, the
reference gathered from the pools per sequence), the drop-in's routing of page_table (our split-KV class where it runs
the call, upstream's function with the reason where it does not, one error for a malformed table) and, compile-marked,
the paged split-KV kernel for sm_120a at pages of 16 and 256 tokens beside the contiguous one. CPU only."""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import experiment
from fa4tune import api, dropin, torch_op
from fa4tune.config import ConfigError, ForwardConfig, Problem, ProblemClass
from fa4tune.feasibility import check_forward
from fa4tune.harness import gate, runtime_guards
from fa4tune.harness.candidates import sdpa_candidate
from fa4tune.kernel_class import forward_kernels
from fa4tune.targets import get_target
from tests.test_dropin import op_calls, upstream_calls  # noqa: F401  (the drop-in's fixtures: upstream's and our op's calls)

ROOT = Path(__file__).resolve().parent.parent
PAGED = Problem(3, 2, 200, 8, 2, 64, 64, True, backward=False, page_size=16)  # 13 pages a sequence, the last part-used
DECODE16 = ProblemClass(128, 128, False, 4, regime="decode", page_size=16)


# ---- the class and problem dimension ----

def test_page_size_is_a_class_dimension_with_its_name_and_the_problem_s():
    assert DECODE16.name == "d128-noncausal-gqa4-page16-decode-bf16"
    assert ProblemClass.parse(DECODE16.name) == DECODE16
    assert ProblemClass.parse("d128-noncausal-gqa4-decode-bf16").page_size == 0
    problem = Problem(8, 1, 16384, 32, 8, 128, 128, False, backward=False, page_size=256)
    assert problem.problem_class == dataclasses.replace(DECODE16, page_size=256)
    assert problem.label.endswith("paged 256")


@pytest.mark.parametrize("page_size", [8, 48, 512, -16, True])
def test_a_page_size_that_is_not_a_power_of_two_from_16_to_256_is_refused_by_name(page_size):
    with pytest.raises(ConfigError, match=rf"page_size: a page holds a power of two of 16 to 256 tokens .*got {page_size!r}"):
        ProblemClass(128, 128, False, page_size=page_size)
    with pytest.raises(ConfigError, match="page_size"):
        Problem(1, 1, 64, 4, 4, 64, 64, False, backward=False, page_size=page_size)


def test_a_paged_problem_is_a_forward_of_padded_sequences():
    with pytest.raises(ConfigError, match="paged_forward_only: .*page_size=16"):
        Problem(1, 1, 64, 4, 4, 64, 64, False, page_size=16)  # backward defaults to True


def test_a_paged_class_runs_the_contiguous_decode_entry_and_ours_where_no_entry_runs_pages():
    assert experiment.TABLES.resolution("fwd", DECODE16).rule == "own"  # its study's (2026-12-07 s15)
    d64 = ProblemClass(64, 64, False, 4, regime="decode", page_size=16)  # no paged d64 class has an entry
    found = experiment.TABLES.resolution("fwd", d64)
    assert found.rule == "fallback" and found.source == "d64-noncausal-gqa4-decode-bf16"
    assert found.config.kernel == "sm120_splitkv" and "page size contiguous for 16" in found.describe()
    # the chunked entries' TMA class runs no pages, nor does upstream's: the paged default, on the split-KV class
    chunked = ProblemClass(128, 128, True, 4, regime="chunked", page_size=16)
    found = experiment.TABLES.resolution("fwd", chunked)
    assert found.rule == "paged" and found.config.kernel == "sm120_splitkv" and "ours for paged KV" in found.describe()
    # a contiguous class never takes a paged class's entry
    from fa4tune.fallback import neighbours

    assert neighbours(ProblemClass(128, 128, False, 4, regime="decode"), [DECODE16.name]) == []
    near = neighbours(DECODE16, ["d128-noncausal-gqa4-page256-decode-bf16", "d128-noncausal-gqa4-decode-bf16",
                                 "d128-noncausal-gqa4-page32-decode-bf16"])
    assert [pc.page_size for pc in near] == [32, 256, 0]  # the nearest page size first, a contiguous cache last


def test_a_kernel_class_that_runs_no_pages_is_refused_for_a_paged_class_by_name():
    verdict = check_forward(ForwardConfig(), DECODE16, get_target(), forward_kernels(experiment))
    assert verdict.rule == "kernel_paged" and "does not run paged" in verdict.message


def test_the_host_path_refuses_a_page_size_for_a_class_that_runs_no_pages():
    from fa4tune.sm120_interface import build

    knobs = build(experiment.kernel_class).flash_attn_fwd.__globals__["_fa4tune_knobs"]
    split = experiment.FORWARD_DISPATCH["d128-noncausal-gqa4-decode-bf16"]
    assert knobs(split, 16) == {"num_splits": 0, "page_size": 16} and knobs(split, None) == {"num_splits": 0}
    with pytest.raises(ConfigError, match="kernel_paged: kernel 'sm120'"):
        knobs(ForwardConfig(), 16)


# ---- the gate: pages shuffled, the reference gathered per sequence ----

def test_paging_shuffles_every_page_of_the_pool_and_draws_ragged_lengths():
    found = gate.paging(PAGED, "cpu", seed=5, ragged=True)
    table, used = found["page_table"], found["seqused_k"]
    assert table.dtype == torch.int32 and table.shape == (3, 13) and used.dtype == torch.int32
    assert sorted(table.flatten().tolist()) == list(range(39))  # the pool's pages, each once
    assert table.tolist() != torch.arange(39).view(3, 13).tolist()  # not in order
    assert used[0] == 200 and all(1 <= n <= 200 for n in used.tolist())
    assert gate.paging(PAGED, "cpu", seed=5)["seqused_k"].tolist() == [200, 200, 200]
    assert gate.paging(dataclasses.replace(PAGED, page_size=0), "cpu") == {}
    k = gate.random_inputs(PAGED, 0, "cpu", count=3)[1]
    assert k.shape == (39, 16, 2, 64)


def _scatter(contiguous: torch.Tensor, table: torch.Tensor, page_size: int) -> torch.Tensor:
    """The page pool a page table reads `contiguous` (batch, seqlen, heads, dim) from."""
    batch, seqlen = contiguous.shape[:2]
    pages = table.shape[1]
    padded = torch.zeros(batch, pages * page_size, *contiguous.shape[2:], dtype=contiguous.dtype)
    padded[:, :seqlen] = contiguous
    pool = torch.empty(batch * pages, page_size, *contiguous.shape[2:], dtype=contiguous.dtype)
    pool[table.long().flatten()] = padded.view(batch * pages, page_size, *contiguous.shape[2:])
    return pool


def test_gathering_the_pages_gives_back_the_contiguous_cache():
    contiguous = torch.randn(3, 200, 2, 64)
    table = gate.paging(PAGED, "cpu", seed=1)["page_table"]
    pool = _scatter(contiguous, table, 16)
    for b, length in enumerate((200, 17, 1)):
        assert torch.equal(gate.gather_pages(pool, table[b], length), contiguous[b, :length])


def _paged_forward(ignore: str = ""):
    """A torch forward of a paged call: gathers each sequence's pages (or, `ignore`="table", reads the pool in order;
    "seqused", every key of the row) and runs the fp32 reference attention, rounded to the input dtype (as a flash
    kernel rounds its output once)."""
    def forward(q, k, v, causal, page_table, seqused_k):
        outs, lses = [], []
        for b in range(q.shape[0]):
            length = page_table.shape[1] * k.shape[1] if ignore == "seqused" else int(seqused_k[b])
            row = torch.arange(b * page_table.shape[1], (b + 1) * page_table.shape[1]) if ignore == "table" else page_table[b]
            keys, values = (gate.gather_pages(pool, row, length)[None] for pool in (k, v))
            ref = gate.reference_attention(q[b:b + 1], keys, values, causal)
            outs.append(ref.out.to(q.dtype))
            lses.append(ref.lse)
        return torch.cat(outs), torch.cat(lses)
    return forward


def test_the_gate_checks_each_sequence_against_its_own_gathered_keys():
    q, k, v = gate.random_inputs(PAGED, 0, "cpu", count=3)
    paged = gate.paging(PAGED, "cpu", seed=3, ragged=True)
    result = gate.gate_forward(_paged_forward(), q, k, v, True, **paged)
    assert result.passed, result.reason
    assert "paged 16" in result.problem
    for ignore in ("table", "seqused"):
        failed = gate.gate_forward(_paged_forward(ignore), q, k, v, True, **paged)
        assert not failed.passed and "sequence 0 of 3 (200 keys)" in failed.reason, failed.reason


def test_a_paged_call_that_writes_its_page_table_fails_as_an_input_write():
    q, k, v = gate.random_inputs(PAGED, 0, "cpu", count=3)
    paged = gate.paging(PAGED, "cpu", seed=3)

    def writing(q, k, v, causal, page_table, seqused_k):
        out = _paged_forward()(q, k, v, causal, page_table, seqused_k)
        page_table[0, 0] += 1
        return out

    from fa4tune.harness.guards import GuardViolation

    with pytest.raises(GuardViolation, match="input_write: .*page_table"):
        gate.gate_forward(writing, q, k, v, True, **paged)


def test_sdpa_gathers_a_paged_call_on_the_device_and_matches_the_reference():
    q, k, v = (t.float() for t in gate.random_inputs(PAGED, 0, "cpu", count=3))
    paged = gate.paging(PAGED, "cpu", seed=3, ragged=True)
    out, lse = sdpa_candidate().forward(q, k, v, True, **paged)
    assert lse is None
    expected, _ = _paged_forward()(q, k, v, True, **paged)
    assert torch.allclose(out, expected, atol=1e-5)


def test_the_timed_row_check_gathers_the_pages():
    q, k, v = gate.random_inputs(PAGED, 0, "cpu", count=3)
    paged = gate.paging(PAGED, "cpu", seed=3, ragged=True)
    out, lse = _paged_forward()(q, k, v, True, **paged)
    rows = torch.tensor([0, 1])
    assert runtime_guards.rows_mismatch(q, k, v, True, rows, out=out, lse=lse, **paged) == ""
    assert runtime_guards.rows_mismatch(q, k, v, True, rows, out=out * 1.1, lse=lse, **paged) != ""


def test_the_rows_checked_after_timing_come_from_a_drawn_sequence_so_a_forward_right_on_one_alone_fails():
    """Without a draw the rows are the sequence with the most used keys (the first of equals); with one, any sequence
    with a key: a paged forward right on sequence 0 alone (the timed calls' even lengths) fails on the others' draws."""
    q, k, v = gate.random_inputs(PAGED, 0, "cpu", count=3)
    paged = gate.paging(PAGED, "cpu", seed=3, ragged=False)
    out, lse = _paged_forward()(q, k, v, True, **paged)
    cheat_out, cheat_lse = out.clone(), lse.clone()
    cheat_out[1:], cheat_lse[1:] = out[:1], lse[:1]  # every sequence handed sequence 0's rows
    rows = torch.tensor([0])
    assert runtime_guards.rows_mismatch(q, k, v, True, rows, out=cheat_out, lse=cheat_lse, **paged) == ""
    verdicts = [runtime_guards.rows_mismatch(q, k, v, True, rows, out=cheat_out, lse=cheat_lse, draw=d, **paged)
                for d in range(q.shape[0])]
    assert verdicts[0] == "" and all(verdicts[1:]), verdicts
    assert all(runtime_guards.rows_mismatch(q, k, v, True, rows, out=out, lse=lse, draw=d, **paged) == ""
               for d in range(q.shape[0]))


def test_a_packed_call_s_rows_come_from_the_drawn_sequence_within_its_length():
    lengths = [5, 9, 3]
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(sum(lengths), 2, 32, generator=generator).bfloat16() for _ in range(3))
    cu = [0, 5, 14, 17]
    rows = runtime_guards.sample_rows(max(lengths), 16, 0)
    outs, lses = [], []
    for start, end in zip(cu[:-1], cu[1:]):
        r = gate.reference_attention(q[None, start:end], k[None, start:end], v[None, start:end], True)
        outs.append(r.out[0].to(q.dtype))
        lses.append(r.lse[0])
    out, lse = torch.cat(outs), torch.cat(lses, dim=-1)
    for d in range(6):  # every sequence drawn, its rows cut to its own length
        assert runtime_guards.rows_mismatch(q, k, v, True, rows, out=out, lse=lse, lengths=lengths, draw=d) == ""
    wrong = out.clone()
    wrong[14:] = 0  # the third sequence (3 rows) left unwritten
    assert runtime_guards.rows_mismatch(q, k, v, True, rows, out=wrong, lse=lse, lengths=lengths, draw=2) != ""
    assert runtime_guards.rows_mismatch(q, k, v, True, rows, out=wrong, lse=lse, lengths=lengths) == ""  # the longest's


# ---- the drop-in: routing and bad input ----

def _paged_call(page_size=16, dtype=torch.int32, batch=2, pages=8):
    q = torch.zeros(batch, 1, 8, 64, dtype=torch.bfloat16)
    pool = torch.zeros(batch * pages, page_size, 2, 64, dtype=torch.bfloat16)
    table = torch.arange(batch * pages).view(batch, pages).to(dtype)
    return q, pool, pool.clone(), table, torch.full((batch,), pages * page_size - 3, dtype=torch.int32)


def test_a_paged_call_goes_to_our_op_with_its_page_table(upstream_calls, op_calls):
    q, k, v, table, used = _paged_call()
    assert dropin.flash_attn_varlen_func(q, k, v, page_table=table, seqused_k=used) == ("ours", None)
    (args,) = op_calls
    assert args[6] is used and args[7] is table and upstream_calls == []
    assert "page_table" not in dropin.UPSTREAM_ONLY


@pytest.mark.parametrize("change, phrase", [
    (dict(window_size=(64, 0), causal=True), "sliding window or a soft-cap"),
    (dict(softcap=30.0), "sliding window or a soft-cap"),
    (dict(seqused_q=torch.ones(2, dtype=torch.int32)), "packed queries or seqused_q"),
    (dict(learnable_sink=torch.zeros(8)), "learnable_sink is set"),
])
def test_a_paged_call_our_class_cannot_run_goes_to_upstream_with_the_reason(change, phrase, upstream_calls, op_calls,
                                                                            caplog):
    q, k, v, table, used = _paged_call()
    with caplog.at_level(logging.DEBUG, logger="fa4tune"):
        assert dropin.flash_attn_varlen_func(q, k, v, page_table=table, seqused_k=used, **change) == ("upstream", None)
    assert op_calls == [] and upstream_calls[0][1]["page_table"] is table and phrase in caplog.text


def test_a_paged_call_with_gradients_goes_to_upstream(upstream_calls, op_calls, caplog):
    q, k, v, table, used = _paged_call()
    with caplog.at_level(logging.DEBUG, logger="fa4tune"):
        dropin.flash_attn_varlen_func(q.requires_grad_(), k, v, page_table=table, seqused_k=used)
    assert op_calls == [] and "page_table with gradients" in caplog.text


@pytest.mark.parametrize("call, rule, value", [
    (dict(dtype=torch.int64), "page_table", "torch.int64"),
    (dict(page_size=8), "page_size", "got 8"),
    (dict(page_size=512), "page_size", "got 512"),
    (dict(page_size=48), "page_size", "got 48"),
])
def test_a_malformed_paged_call_is_one_error_naming_the_rule_and_the_value(call, rule, value, upstream_calls, op_calls):
    q, k, v, table, used = _paged_call(**call)
    with pytest.raises(ConfigError, match=rf"^{rule}: .*{value}"):
        dropin.flash_attn_varlen_func(q, k, v, page_table=table, seqused_k=used)
    assert upstream_calls == [] and op_calls == []


def test_malformed_table_shapes_and_pools_are_refused_by_name(upstream_calls, op_calls):
    q, k, v, table, used = _paged_call()
    with pytest.raises(ConfigError, match=r"^page_table: .*2-d int32 .*\(16,\)"):
        dropin.flash_attn_varlen_func(q, k, v, page_table=table.flatten(), seqused_k=used)
    with pytest.raises(ConfigError, match=r"^page_table: page_table has 1 rows"):
        dropin.flash_attn_varlen_func(q, k, v, page_table=table[:1], seqused_k=used)
    with pytest.raises(ConfigError, match=r"^paged_kv_layout: .*\(16, 16, 2, 64\) and \(16, 32, 1, 64\)"):
        dropin.flash_attn_varlen_func(q, k, v.view(16, 32, 1, 64), page_table=table, seqused_k=used)
    with pytest.raises(ConfigError, match=r"^page_table: a paged call takes seqused_k .* not cu_seqlens_k"):
        dropin.flash_attn_varlen_func(q[0], k, v, page_table=table, cu_seqlens_k=torch.zeros(3, dtype=torch.int32))


@pytest.fixture
def host_calls(monkeypatch):
    calls = []
    monkeypatch.setattr(api, "run_forward", lambda *args: calls.append(args) or ("out", "lse"))
    torch_op.use_tables(experiment.TABLES)
    yield calls
    torch_op._TABLES.clear()
    torch_op._MEMO.clear()


@pytest.mark.parametrize("seqlen_q, expected", [(1, "d128-noncausal-gqa4-page16-decode-bf16 runs its own entry"),
                                                (64, "ours for paged KV")])
def test_the_op_runs_a_paged_decode_and_chunk_on_a_class_that_runs_pages(seqlen_q, expected, host_calls, caplog):
    from fa4tune.kernel_class import runs_features

    q = torch.zeros(2, seqlen_q, 32, 128, dtype=torch.bfloat16)
    pool = torch.zeros(64, 16, 8, 128, dtype=torch.bfloat16)
    table, used = torch.zeros(2, 32, dtype=torch.int32), torch.tensor([100, 512], dtype=torch.int32)
    with caplog.at_level(logging.DEBUG, logger="fa4tune"):
        torch_op.tuned_forward(q, pool, pool, None, None, None, used, table, None, None, None, seqlen_q > 1, None, None,
                               0.0, 1, None, False)
    (kernel_class, *_, config, packed, extras), = host_calls
    assert "paged" in runs_features(kernel_class(config)) and extras.page_table is table and extras.seqused_k is used
    assert "-page16-" in caplog.text and expected in caplog.text


def test_api_refuses_gradients_and_a_kernel_that_runs_no_pages_by_name():
    q, k, v, table, used = _paged_call()
    with pytest.raises(ConfigError, match="paged_forward_only"):
        api.attention(q.requires_grad_(), k, v, tables=experiment.TABLES, page_table=table, seqused_k=used)
    with torch.no_grad(), pytest.raises(ConfigError, match="kernel_paged: kernel 'sm120'"):
        api.attention(q, k, v, fwd_config=ForwardConfig(), tables=experiment.TABLES, page_table=table, seqused_k=used)


def test_torch_compile_fullgraph_traces_a_paged_decode_with_no_graph_break():
    q, k, v, table, used = (t.to("meta") for t in _paged_call())

    def step(q, k, v, table, used):
        return dropin.flash_attn_varlen_func(q, k, v, page_table=table, seqused_k=used)[0]

    torch._dynamo.reset()
    explained = torch._dynamo.explain(step)(q, k, v, table, used)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    torch._dynamo.reset()
    assert torch.compile(step, fullgraph=True, backend="aot_eager")(q, k, v, table, used).shape == q.shape


# ---- sm_120a compiles (fake tensors) ----

def _probe(jobs, tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "splitkv_probe.py"), str(tmp_path)], input=json.dumps(jobs),
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.compile
def test_the_paged_decode_compiles_for_sm_120a_at_16_and_256_token_pages_beside_the_contiguous_one(tmp_path):
    """The decode class's entry on Llama 3 8B's decode (32 / 8 heads, d128, 16K keys, batch 8): contiguous, paged 16
    (each row from its page) and paged 256 (a tile within a page) through the harness's call, and paged 16 through the
    drop-in's op with ragged seqused_k; all split, no spills, the shared storage the declared formula (the pages add
    none), registers within 255 and printed beside the contiguous kernel's."""
    problem = Problem(8, 1, 16384, 32, 8, 128, 128, False, backward=False)
    entry = experiment.TABLES.forward_config(problem.problem_class).to_dict()
    jobs = [{"config": entry, "problem": dataclasses.replace(problem, page_size=page).to_dict()} for page in (0, 16, 256)]
    jobs.append({"problem": dataclasses.replace(problem, page_size=16).to_dict(), "seqused_k": [16384, 100, 5000, 1, 17, 16, 15, 8000]})
    contiguous, page16, page256, dropin_call = _probe(jobs, tmp_path)
    for facts, page in ((contiguous, 0), (page16, 16), (page256, 256)):
        print(f"page_size {page or 'contiguous'}: registers {facts['registers']}, spill stores {facts['spill_store_bytes']} B, "
              f"shared memory {facts['dynamic_smem_bytes']} B, {facts['splits']} splits")
        assert facts["page_size_built"] == [page] and facts["split_kv_compiled"] == [True] and facts["splits"] > 1
        assert facts["dynamic_smem_bytes"] == facts["declared_smem_bytes"] == contiguous["dynamic_smem_bytes"] <= 101376
        assert facts["spill_store_bytes"] == 0 and facts["stack_bytes"] == 0 and facts["registers"] <= 255
    assert dropin_call["page_size_built"] == [16] and dropin_call["seqused_k_traced"] == [True]
    assert "d128-noncausal-gqa4-page16-decode-bf16" in dropin_call["debug_line"]
    assert dropin_call["spill_store_bytes"] == 0 and dropin_call["registers"] <= 255


def test_the_harness_gates_times_and_guards_a_paged_problem_on_the_cpu():
    """measure_step on a paged problem: the candidates get the pools, the table and seqused_k (the gate's cases with
    ragged lengths, the timed calls' and their checks with the problem's), the one that reads the pool in order is
    incorrect, named by sequence; a correct one passes the run-time guards with its table too."""
    from fa4tune.harness import steps
    from fa4tune.harness.candidates import Candidate
    from fa4tune.harness.settings import Settings

    problem = Problem(2, 1, 100, 4, 2, 32, 32, True, backward=False, page_size=16)
    settings = Settings(gate_seed=7, warmup=1, rounds=2, input_sets=2, gate_random_problems=1)
    right = Candidate("gathers", _paged_forward(), {})
    wrong = Candidate("in order", _paged_forward("table"), {})
    results = steps.measure_step(problem, "fwd", [sdpa_candidate(), right, wrong], device="cpu", settings=settings)
    assert results["gathers"].status == "ok" and results["torch sdpa"].status == "ok", results
    assert results["in order"].status == "incorrect" and "sequence 0 of 2" in results["in order"].reason
    runtime_guards.check_candidate(right.forward, problem, "fwd", "cpu", seed=3)  # raises GuardViolation if it fails


def test_a_paged_forward_that_remembers_its_output_per_page_table_is_caught():
    """A cheat of the lead's own (issue 66 on the paged path): the timed call's page table is one tensor through every
    round (only q and the pools are rewritten between rounds), so a forward that keeps its first output per table
    (data_ptr) and returns a fresh copy of it afterwards would skip every timed call's work. Each gate case draws a
    table of its own, so the cheat passes the gate; the check of the timed outputs against the rewritten inputs
    catches it."""
    from fa4tune.harness import steps
    from fa4tune.harness.candidates import Candidate
    from fa4tune.harness.settings import Settings

    honest, remembered = _paged_forward(), {}

    def remembers(q, k, v, causal, page_table, seqused_k):
        key = page_table.data_ptr()
        if key not in remembered:
            remembered[key] = honest(q, k, v, causal, page_table, seqused_k)
        return tuple(t.clone() for t in remembered[key])

    problem = Problem(2, 1, 100, 4, 2, 32, 32, True, backward=False, page_size=16)
    settings = Settings(gate_seed=7, warmup=1, rounds=2, input_sets=2, gate_random_problems=1)
    results = steps.measure_step(problem, "fwd", [sdpa_candidate(), Candidate("remembers", remembers, {})], device="cpu",
                                 settings=settings)
    assert results["torch sdpa"].status == "ok", results
    # caught after timing (output_reuse), or in the gate where the allocator hands a later case's table the address
    # of an earlier one's (a freed table's memory reused), so the remembered output is another case's
    caught = results["remembers"]
    assert (caught.status == "guard" and "output_reuse" in caught.reason) or (
        caught.status == "incorrect" and "> tolerance" in caught.reason), caught


def test_a_paged_forward_that_computes_only_the_first_sequence_when_the_lengths_are_even_is_caught():
    """A cheat of the lead's own (issue 66, s13's review): the gate's paged cases have ragged used lengths, the timed
    calls' tables the problem's (every sequence seqlen_k), and the rows a timed output is sampled on are the longest
    sequence's, the first of equals. So a forward that, where every used length is the same, computes sequence 0 alone
    and hands the others sequence 0's rows (a device-side test in a real kernel, no host sync) passes the gate and
    every sampled-rows check. The whole check of one input set each round, every sequence against its own keys,
    catches it."""
    from fa4tune.harness import steps
    from fa4tune.harness.candidates import Candidate
    from fa4tune.harness.settings import Settings

    honest = _paged_forward()

    def first_only(q, k, v, causal, page_table, seqused_k):
        if seqused_k is None or bool((seqused_k == seqused_k[0]).all()):  # the timed calls' even lengths
            out, lse = honest(q[:1], k, v, causal, page_table[:1], None if seqused_k is None else seqused_k[:1])
            return out.expand(q.shape[0], *out.shape[1:]).clone(), lse.expand(q.shape[0], *lse.shape[1:]).clone()
        return honest(q, k, v, causal, page_table, seqused_k)

    problem = Problem(3, 1, 100, 4, 2, 32, 32, True, backward=False, page_size=16)
    settings = Settings(gate_seed=7, warmup=1, rounds=2, input_sets=2, gate_random_problems=1)
    results = steps.measure_step(problem, "fwd", [sdpa_candidate(), Candidate("first only", first_only, {})], device="cpu",
                                 settings=settings)
    assert results["torch sdpa"].status == "ok", results
    caught = results["first only"]
    # past the gate (its ragged cases run honestly): the check after timing, whole on one set, and on the others on
    # rows of a sequence drawn after the call (sequence 0, whose rows are right, two times in three)
    assert caught.status == "incorrect" and "checked after timing" in caught.reason, caught
