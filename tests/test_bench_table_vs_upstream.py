"""bench/table_vs_upstream.py's CPU parts: the steps and kernels it plans, the order it alternates, and the
summary's rule (a loss is a slowdown beyond the run-to-run spread); search.evaluating.ahead's job grouping."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import experiment
from fa4tune import defaults
from fa4tune.suites import load_suite
from search.evaluating.ahead import group_jobs

from bench import table_vs_upstream
from search_helpers import ROOT


def load_bench():
    return table_vs_upstream


def test_plan_takes_both_directions_where_a_problem_has_a_backward_and_the_table_and_upstream_configs_of_its_class():
    bench = load_bench()
    steps = bench.plan(["standard", "generalization"], experiment)
    problems = load_suite("standard") + load_suite("generalization")
    assert len(steps) == sum(2 if p.backward else 1 for p in problems)
    for s in steps:
        pc = s.problem.problem_class
        assert s.table == (experiment.forward_config(pc), experiment.backward_config(pc))
        assert s.upstream == (defaults.upstream_forward(pc), defaults.upstream_backward(pc))
    assert {s.direction for s in steps if s.problem.problem_class.regime == "decode"} == {"fwd"}
    assert [s.problem.label for s in bench.plan(["standard"], experiment, only="wan")] == ["wan2.1 self-attn"] * 2
    picked = bench.plan(["standard"], experiment, only="wan,gqa prefill 2k", directions=("bwd",))
    assert [(s.problem.label, s.direction) for s in picked] == [("gqa prefill 2k", "bwd"), ("wan2.1 self-attn", "bwd")]


def test_every_kernel_a_step_runs_is_compiled_ahead_and_jobs_group_by_config_and_shape_family():
    bench = load_bench()
    steps = bench.plan(["generalization"], experiment)
    pairs = bench.compile_pairs(steps)
    for s in steps:
        for fwd, bwd in (s.table, s.upstream):
            assert ("fwd", fwd, s.problem) in pairs  # a backward step runs its candidate's forward too
            if s.direction == "bwd":
                assert ("bwd", bwd, s.problem) in pairs
    assert not [p for kind, _, p in pairs if kind == "bwd" and not p.backward]
    jobs = group_jobs(pairs)
    assert sum(len(problems) for _, _, problems in jobs) == len(pairs)
    for kind, cfg, problems in jobs:
        assert len({(p.head_dim, p.num_heads // p.num_heads_kv) for p in problems}) == 1
        assert all((kind, cfg, p) in pairs for p in problems)


def test_runs_alternate_the_candidates_order(tmp_path, monkeypatch):
    bench = load_bench()
    assert bench.order(1) == ("table", "upstream") and bench.order(2) == ("upstream", "table") and bench.order(3) == bench.order(1)
    # and main() hands measure_step the candidates in that order, run after run (the GPU parts faked)
    from fa4tune.config import BackwardConfig, ForwardConfig, Problem
    from fa4tune.harness import candidates as harness_candidates, gpu, steps as harness_steps
    from fa4tune.harness.measurement import ProblemResult

    problem = Problem(1, 128, 128, 2, 2, 64, 64, False, backward=False, name="p")
    configs = (ForwardConfig(), BackwardConfig())
    step = bench.Step("s", problem, "fwd", configs, configs)
    seen = []

    def measure_step(problem, direction, candidates, **kwargs):
        seen.append(tuple(c.name for c in candidates))
        return {c.name: ProblemResult(problem.label, direction, "ok", tflops=1.0, ms_median=1.0) for c in candidates}

    monkeypatch.setattr(bench, "plan", lambda suites, experiment, only, directions: [step])
    monkeypatch.setattr(bench, "compile_ahead", lambda *args, **kwargs: None)
    monkeypatch.setattr(harness_candidates, "load_experiment", lambda path: experiment)
    monkeypatch.setattr(harness_candidates, "experiment_candidate", lambda module, fwd, bwd, name: harness_candidates.Candidate(name, None, {}))
    monkeypatch.setattr(gpu, "read_device", lambda: gpu.DeviceInfo("fake GPU", (12, 0), 1))
    monkeypatch.setattr(gpu, "select_mode", lambda info, target: "native")
    monkeypatch.setattr(harness_steps, "make_flusher", lambda device: None)
    monkeypatch.setattr(harness_steps, "measure_step", measure_step)
    assert bench.main(["--runs", "3", "--out", str(tmp_path / "out.jsonl"), "--compile-jobs", "0"]) == 0
    assert seen == [bench.order(1), bench.order(2), bench.order(3)]
    # a run cut by a call's limit goes on in the next call: run 2 alone keeps run 2's order and number
    seen.clear()
    assert bench.main(["--runs", "1", "--first-run", "2", "--out", str(tmp_path / "two.jsonl"), "--compile-jobs", "0"]) == 0
    assert seen == [bench.order(2)]
    assert {json.loads(line)["run"] for line in (tmp_path / "two.jsonl").read_text().splitlines()} == {2}


def _records(problem, direction, regime, table_ms, upstream_ms, status="ok"):
    out = []
    for run, (t, u) in enumerate(zip(table_ms, upstream_ms), start=1):
        for name, ms in (("table", t), ("upstream", u)):
            out.append({"suite": "s", "problem": problem, "direction": direction, "regime": regime, "class": "c",
                        "run": run, "candidate": name, "status": status if name == "table" and run == 2 else "ok",
                        "ms_median": ms, "reason": "boom" if status != "ok" else ""})
    return out


def test_summary_speedup_spread_verdict_and_geomeans():
    bench = load_bench()
    records = (_records("a", "fwd", "prefill", [1.0, 1.0], [1.2, 1.2])  # 1.2x, no spread: wins
               + _records("b", "fwd", "chunked", [1.0, 1.02], [0.99, 1.0])  # 0.985x inside a 2 % spread
               + _records("c", "fwd", "prefill", [1.2, 1.2], [1.0, 1.01])  # 0.838x beyond a 1 % spread: loses
               + _records("d", "fwd", "decode", [0.1, 0.1], [1.0, 1.0])
               + _records("e", "bwd", "prefill", [1.0, 1.0], [1.1, 1.1])
               + _records("f", "bwd", "prefill", [1.0, 1.0], [1.1, 1.1], status="incorrect"))
    s = bench.summarize(records)
    rows = {r["problem"]: r for r in s["rows"]}
    assert rows["a"]["speedup"] == pytest.approx(1.2) and rows["a"]["verdict"] == "wins"
    assert rows["b"]["spread"] == pytest.approx(0.02) and rows["b"]["verdict"] == "within spread"
    assert rows["c"]["verdict"] == "loses" and s["losses"] == ["c fwd"]
    assert rows["f"]["speedup"] is None and rows["f"]["verdict"].startswith("failed: table run 2: incorrect: boom")
    assert s["failures"] == ["f bwd"]
    # a chunked prefill is a prefill; a decode is not
    assert s["fwd_prefill_geomean"] == pytest.approx((1.2 * rows["b"]["speedup"] * rows["c"]["speedup"]) ** (1 / 3))
    assert s["fwd_decode_geomean"] == pytest.approx(10.0) and s["bwd_geomean"] == pytest.approx(1.1)
    assert s["min_speedup"] == pytest.approx(rows["c"]["speedup"])


def test_the_same_config_timed_twice_is_never_a_loss():
    """Where the table's entry is upstream's config, a 0.04 % difference with a smaller spread is the noise between
    two interleaved copies of one kernel (measured: 0.2401 vs 0.2400 ms, spread 0.0 %), not a loss."""
    bench = load_bench()
    same = [{**r, "same_config": True} for r in _records("same", "fwd", "chunked", [0.2402, 0.2402], [0.2400, 0.2400])]
    other = _records("other", "fwd", "chunked", [0.2402, 0.2402], [0.2400, 0.2400])  # a different kernel: it loses
    mixed = [{**r, "same_config": r["run"] == 1} for r in _records("mixed", "fwd", "prefill", [0.2402, 0.2402], [0.2400, 0.2400])]
    s = bench.summarize(same + other + mixed)
    rows = {r["problem"]: r for r in s["rows"]}
    assert rows["same"]["verdict"] == "same config" and rows["same"]["speedup"] < 1
    assert rows["other"]["verdict"] == "loses" and rows["mixed"]["verdict"] == "loses"  # same in every run, or not
    assert s["losses"] == ["other fwd", "mixed fwd"]


def test_summarize_reads_a_finished_run_and_a_torn_last_line(tmp_path):
    path = tmp_path / "run.jsonl"
    lines = [json.dumps(r) for r in _records("a", "fwd", "prefill", [1.0, 1.0], [1.1, 1.1])]
    path.write_text("\n".join(lines) + '\n{"suite": "s", "prob')  # a run killed mid-write
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "table_vs_upstream.py"), "--summarize", str(path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "fwd_prefill_geomean: 1.100" in done.stdout and "losses: none" in done.stdout


def test_summarize_joins_two_calls_runs_and_a_rerun_step_replaces_its_earlier_record(tmp_path):
    """s13's table: run 1 whole and run 2 cut in one call, run 2 whole in the next: one two-run table."""
    first, second = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    run1 = [r for r in _records("a", "fwd", "prefill", [1.0, 9.0], [1.2, 9.0]) if r["run"] == 1]
    cut = [r for r in _records("a", "fwd", "prefill", [1.0, 9.0], [1.2, 9.0]) if r["run"] == 2]  # a stale run 2
    run2 = [{**r, "status": "ok"} for r in _records("a", "fwd", "prefill", [1.0, 1.0], [1.3, 1.3]) if r["run"] == 2]
    first.write_text("".join(json.dumps(r) + "\n" for r in run1 + cut))
    second.write_text("".join(json.dumps(r) + "\n" for r in run2))
    bench = load_bench()
    records = bench.read_runs([str(first), str(second)])
    assert len(records) == 4 and sorted(r["run"] for r in records) == [1, 1, 2, 2]
    assert {r["ms_median"] for r in records if r["run"] == 2} == {1.0, 1.3}  # the second call's run 2
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "table_vs_upstream.py"), "--summarize",
                           f"{first},{second}"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "fwd_prefill_geomean: 1.250" in done.stdout


def test_upstream_is_not_timed_where_the_target_refuses_its_configs_and_the_row_says_so():
    """At d256 upstream's forward tiles need 131072 B of SM120's 101376 (its backward 148480 B): an H100 or H200
    emulating SM120 would run them (measured 3.8x slower than ours, a figure no SM120 GPU can show), so they are
    not timed and the row names the rule."""
    bench = load_bench()
    steps = {(s.problem.name, s.direction): s for s in bench.plan(["wide"], experiment)}
    d256 = steps[("gemma2-9b prefill 4k bf16", "fwd")]
    assert d256.upstream_refused.startswith(bench.NOT_RUN + "sm120: forward config: smem_capacity: needs 131072 B")
    assert "131072 B" in steps[("d256 non-causal train 4k bf16 (synthetic)", "bwd")].upstream_refused  # its forward first
    assert not steps[("deepseek-v2-lite train 4k bf16", "bwd")].upstream_refused  # upstream's own tiles fit d192/v128
    compiled = bench.compile_pairs([d256])
    assert compiled == [("fwd", d256.table[0], d256.problem)]  # only the table's kernel is compiled ahead
    records = [{**r, "status": "infeasible", "ms_median": None, "reason": d256.upstream_refused} if r["candidate"] == "upstream" else r
               for r in _records("wide", "fwd", "prefill", [0.68, 0.67], [2.57, 2.56])]
    s = bench.summarize(records + _records("a", "fwd", "prefill", [1.0, 1.0], [1.2, 1.2]))
    row = {r["problem"]: r for r in s["rows"]}["wide"]
    assert row["speedup"] is None and row["verdict"].startswith("upstream cannot run: sm120: forward config: smem_capacity")
    assert s["upstream_cannot_run"] == ["wide fwd"] and s["failures"] == [] and s["fwd_prefill_geomean"] == pytest.approx(1.2)


def test_each_step_says_whether_its_class_runs_its_own_entry_or_a_neighbour_s_and_the_summary_groups_by_it(capsys):
    bench = load_bench()
    steps = {(s.problem.label, s.direction): s for s in bench.plan(["models"], experiment)}
    assert steps[("llama3-8b prefill 4k bf16", "fwd")].entry == "own"
    assert steps[("llama3-8b prefill 4k fp16", "fwd")].entry == "fallback d128-causal-gqa4-bf16"  # fp16 <-> bf16
    assert steps[("phi3-mini prefill 2k x2 fp16", "fwd")].entry == "fallback d96-causal-bf16"  # fp16 <-> bf16
    assert steps[("qwen2.5-7b prefill 4k fp16", "fwd")].entry == "fallback d128-causal-gqa8-bf16"  # the nearest GQA ratio
    assert steps[("gemma2-27b prefill 4k bf16", "fwd")].entry == "own"  # GQA 2 has its own entry since 2026-12-06
    assert steps[("gemma3-27b chunked 512 over 16k bf16", "fwd")].entry == "fallback d128-causal-chunked-bf16"  # nearest ratio
    assert {s.entry.split(" ")[0] for s in steps.values()} <= {"own", "fallback", "upstream", "wide"}
    records = [dict(r, entry=e) for rows, e in ((_records("a", "fwd", "prefill", [1.0, 1.0], [1.2, 1.2]), "own"),
                                                (_records("b", "fwd", "prefill", [1.0, 1.0], [1.1, 1.1]), "fallback x"),
                                                (_records("c", "fwd", "decode", [1.0, 1.0], [2.0, 2.0]), "fallback y"))
               for r in rows]
    summary = bench.summarize(records)
    assert summary["by_entry"] == {("fwd", "decode", "fallback"): (1, pytest.approx(2.0), pytest.approx(2.0)),
                                   ("fwd", "prefill", "fallback"): (1, pytest.approx(1.1), pytest.approx(1.1)),
                                   ("fwd", "prefill", "own"): (1, pytest.approx(1.2), pytest.approx(1.2))}
    bench.print_summary(summary, "test")
    printed = capsys.readouterr().out
    assert "entry fwd prefill fallback: 1 problems, geomean 1.100, min 1.100" in printed
    assert "fallback fwd c: runs x's entry" in printed  # _records names every class "c"


def test_fa2_is_timed_beside_the_two_on_backward_steps_without_gqa_and_the_summary_compares_the_table_to_it(capsys):
    bench = load_bench()
    from fa4tune.config import BackwardConfig, ForwardConfig, Problem

    configs = (ForwardConfig(), BackwardConfig())
    mha = Problem(1, 128, 128, 2, 2, 64, 64, False, backward=True, name="mha")
    gqa = Problem(1, 128, 128, 8, 2, 64, 64, False, backward=True, name="gqa")
    assert bench.takes_fa2(bench.Step("s", mha, "bwd", configs, configs))
    assert not bench.takes_fa2(bench.Step("s", mha, "fwd", configs, configs))
    assert not bench.takes_fa2(bench.Step("s", gqa, "bwd", configs, configs))
    assert bench.fa2_candidate().name == "fa2"
    records = _records("e", "bwd", "prefill", [1.0, 1.0], [1.3, 1.3])
    records += [{**records[0], "candidate": "fa2", "run": run, "ms_median": ms} for run, ms in ((1, 1.1), (2, 1.2))]
    s = bench.summarize(records)
    assert s["over_fa2"] == {"e": pytest.approx(1.15)} and s["rows"][0]["speedup"] == pytest.approx(1.3)
    bench.print_summary(s, "fake")
    assert "fa2 e bwd: 1.1000 / 1.2000 ms, the table 1.150x FA2, FA2 1.130x upstream" in capsys.readouterr().out
    failed = records[:4] + [{**records[4], "status": "error", "reason": "no flash kernel"}, records[5]]
    s = bench.summarize(failed)  # FA2 failing leaves the table's verdict alone and says so
    assert s["rows"][0]["verdict"] == "wins" and s["over_fa2"] == {}
    bench.print_summary(s, "fake")
    assert "fa2 e bwd: run 1: error: no flash kernel" in capsys.readouterr().out


@pytest.mark.parametrize("seqlen_q, seqlen_k", [(5, 9), (64, 64), (1, 33)])
def test_fa2_runs_the_gate_s_causal_cases_with_fewer_queries_than_keys_bottom_right_aligned(seqlen_q, seqlen_k):
    """The gate's causal cases with seqlen_q < seqlen_k crashed FA2 on the GPU ("No available kernel": a materialized
    mask has no CUDA flash kernel; CPU's takes one, so this checks the lower-right causal bias that replaced it: FA's
    alignment and the gradients)."""
    import torch

    from fa4tune.harness.gate import causal_mask

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, n, 2, 64, requires_grad=True) for n in (seqlen_q, seqlen_k, seqlen_k))
    out, lse = load_bench().fa2_candidate().forward(q, k, v, True)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / 8
    scores = scores.masked_fill(causal_mask(torch.arange(seqlen_q), seqlen_q, seqlen_k, seqlen_k), float("-inf"))
    expected = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(scores, dim=-1), v)
    assert lse is None and out.shape == expected.shape
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    (dq,) = torch.autograd.grad(out.sum(), q)  # the backward is what --fa2 times
    (dq_expected,) = torch.autograd.grad(expected.sum(), q)
    torch.testing.assert_close(dq, dq_expected, atol=1e-4, rtol=1e-4)


# ---- emulation fidelity (bench/fidelity.py) ----

def _fidelity(flag: str = "") -> dict:
    sm120a = {"arch": "sm_120a", "registers": 255, "spill_bytes": 1464, "ctas_per_sm": 1}
    run = {"arch": "sm_90a", "registers": 32 if flag else 250, "spill_bytes": 30500 if flag else 1464, "ctas_per_sm": 1}
    return {"sm120a": sm120a, "run": run, "flag": flag, "unchecked": ""}


def test_a_flagged_row_is_left_out_of_the_geomeans_and_the_lowest_speedup_and_named(capsys):
    """A row whose candidate's emulating compile disagrees with its sm_120a compile (upstream's d192/v128 backward:
    30.9x in emulation, 32 registers and 30,500 B of spills against SM120's 255 and 1,464 B) says nothing about SM120:
    the summary counts and names it and leaves it out of the geomeans."""
    bench = load_bench()
    flagged = [{**r, "fidelity": _fidelity("spills differ by more than 512 B: ...") if r["candidate"] == "upstream" else _fidelity()}
               for r in _records("d192", "bwd", "prefill", [2.0, 2.0], [61.9, 61.9])]
    kept = [{**r, "fidelity": _fidelity()} for r in _records("d128", "bwd", "prefill", [1.0, 1.0], [1.1, 1.1])]
    unchecked = _records("old", "bwd", "prefill", [1.0, 1.0], [1.3, 1.3])  # lines of a run before the flag: no fidelity
    s = bench.summarize(flagged + kept + unchecked)
    rows = {r["problem"]: r for r in s["rows"]}
    assert rows["d192"]["flag"] == "upstream: spills differ by more than 512 B: ..." and rows["d192"]["speedup"] == pytest.approx(30.95)
    assert rows["d192"]["verdict"] == "wins" and rows["d128"]["flag"] == "" and rows["old"]["flag"] == ""
    assert s["bwd_geomean"] == pytest.approx((1.1 * 1.3) ** 0.5) and s["min_speedup"] == pytest.approx(1.1)
    assert s["fidelity_flagged"] == ["d192 bwd"] and s["by_entry"][("bwd", "prefill", "?")][0] == 2
    bench.print_summary(s, "fake")
    printed = capsys.readouterr().out
    assert "fidelity_flagged: 1 of 3 rows (left out of the geomeans and the lowest speedup): d192 bwd" in printed
    assert "upstream sm_120a 255 regs, 1464 B spilled, 1 CTAs/SM | sm_90a 32 regs, 30500 B spilled, 1 CTAs/SM" in printed
    assert "-> FLAGGED: upstream: spills differ" in printed and "bwd_geomean: 1.196" in printed


def _fake_gpu(monkeypatch, bench, step):
    from fa4tune.harness import candidates as harness_candidates, gpu, steps as harness_steps
    from fa4tune.harness.measurement import ProblemResult

    def measure_step(problem, direction, candidates, **kwargs):
        ms = {"table": 2.0, "upstream": 61.9, "fa2": 2.5}
        return {c.name: ProblemResult(problem.label, direction, "ok", tflops=1.0, ms_median=ms[c.name]) for c in candidates}

    monkeypatch.setattr(bench, "plan", lambda suites, experiment, only, directions: [step])
    monkeypatch.setattr(bench, "compile_ahead", lambda *args, **kwargs: None)
    monkeypatch.setattr(harness_candidates, "load_experiment", lambda path: experiment)
    monkeypatch.setattr(harness_candidates, "experiment_candidate", lambda module, fwd, bwd, name: harness_candidates.Candidate(name, None, {}))
    monkeypatch.setattr(gpu, "read_device", lambda: gpu.DeviceInfo("fake H100", (9, 0), 132))
    monkeypatch.setattr(gpu, "select_mode", lambda info, target: "emulated")
    monkeypatch.setattr(harness_steps, "make_flusher", lambda device: None)
    monkeypatch.setattr(harness_steps, "measure_step", measure_step)


def test_each_timed_candidate_s_line_carries_its_fidelity_from_the_facts_compiled_ahead(tmp_path, monkeypatch, capsys):
    bench = load_bench()
    from bench import fidelity
    from fa4tune.config import BackwardConfig, ForwardConfig, Problem

    problem = Problem(1, 4096, 4096, 16, 16, 192, 128, True, name="d192")
    table, upstream = (ForwardConfig(), BackwardConfig(num_threads=256)), (ForwardConfig(), BackwardConfig())
    step = bench.Step("wide", problem, "bwd", table, upstream)
    _fake_gpu(monkeypatch, bench, step)
    seen = {}

    def gather(jobs, target, experiment_path, workers, gpu_arch, gpu_env, log):
        seen.update(jobs=jobs, gpu_arch=gpu_arch, workers=workers)
        sm120a = {"arch": "sm_120a", "registers": 255, "spill_bytes": 1464, "ctas_per_sm": 1}
        return {fidelity.facts_key("bwd", table[1], problem.problem_class): {"sm120a": sm120a, "run": {**sm120a, "arch": "sm_90a"}},
                fidelity.facts_key("bwd", upstream[1], problem.problem_class): {
                    "sm120a": sm120a, "run": {"arch": "sm_90a", "registers": 32, "spill_bytes": 30500, "ctas_per_sm": 1}}}

    monkeypatch.setattr(fidelity, "gather", gather)
    monkeypatch.setattr(bench, "gpu_compile", lambda jobs: ("sm_90a", {"CUTE_DSL_ARCH": "sm_90a"}))
    out = tmp_path / "out.jsonl"
    assert bench.main(["--runs", "1", "--out", str(out), "--compile-jobs", "3", "--fa2"]) == 0
    assert seen["gpu_arch"] == "sm_90a" and seen["workers"] == 3
    assert seen["jobs"] == [("bwd", table[1], problem), ("bwd", upstream[1], problem)]  # the timed kernels: the backward's
    lines = {r["candidate"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert lines["table"]["fidelity"]["flag"] == "" and lines["upstream"]["fidelity"]["flag"].startswith("spills differ by more than 512 B")
    assert lines["upstream"]["fidelity"]["run"]["registers"] == 32 and "fidelity" not in lines["fa2"]  # FA2: no SM120 kernel
    printed = capsys.readouterr().out
    assert "fidelity_flagged: 1 of 1 rows" in printed and "bwd_geomean: n/a" in printed


def test_fidelity_only_compiles_on_the_cpu_without_timing(monkeypatch, capsys):
    bench = load_bench()
    from bench import fidelity
    from fa4tune.harness import gpu

    monkeypatch.setattr(gpu, "read_device", lambda: pytest.fail("--fidelity-only needs no GPU"))
    calls = []
    monkeypatch.setattr(fidelity, "gather", lambda jobs, target, path, workers, gpu_arch, gpu_env, log: calls.append((gpu_arch, gpu_env)) or {})
    assert bench.main(["--suites", "wide", "--only", "deepseek", "--fidelity-only", "--compile-jobs", "0"]) == 0
    assert bench.main(["--suites", "wide", "--only", "deepseek", "--fidelity-only", "sm_90a"]) == 0
    assert calls[0] == (None, None) and calls[1][0] == "sm_90a" and calls[1][1]["CUTE_DSL_ARCH"] == "sm_90a"
    assert "deepseek-v2-lite train 4k bf16     bwd  table not compiled | not compiled; upstream" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="error: fidelity_arch: --fidelity-only takes an arch such as sm_90a, got 'hopper'"):
        bench.main(["--suites", "wide", "--only", "deepseek", "--fidelity-only", "hopper"])
