"""run_experiment end to end on CPU (a torch "kernel" in child processes), and the baseline plan."""

import sys

import prepare
from fa4tune.config import Problem
from fa4tune.harness import baselines, candidates, gate, gpu, metrics, runs, self_check, steps
from fa4tune.harness.results_tsv import read_rows
from fa4tune.harness.settings import Settings
from fa4tune.targets import get_target

FAKE_EXPERIMENT = '''
from fa4tune import defaults
from tests.prepare_child_targets import torch_attention as attention

forward_config = defaults.upstream_forward
backward_config = defaults.upstream_backward
'''

SUITE = '''{"problems": [
  {"name": "tiny d64 causal", "batch": 1, "seqlen_q": 64, "seqlen_k": 64, "num_heads": 2, "num_heads_kv": 2, "head_dim": 64, "causal": true},
  {"name": "tiny d256", "batch": 1, "seqlen_q": 64, "seqlen_k": 64, "num_heads": 2, "num_heads_kv": 2, "head_dim": 256, "causal": false},
  {"name": "tiny decode", "batch": 1, "seqlen_q": 1, "seqlen_k": 80, "num_heads": 4, "num_heads_kv": 2, "head_dim": 64, "causal": false, "backward": false}
]}'''

CPU = runs.RunContext(get_target("sm120"), gpu.DeviceInfo("cpu (test)", (0, 0), 1), "cpu")


def test_run_experiment_prints_table_then_metric_lines_and_appends_a_row(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    # the fake is imported as module `experiment`: put back whatever was there (or nothing) afterwards
    monkeypatch.setitem(sys.modules, "experiment", sys.modules.get("experiment"))
    experiment_file = tmp_path / "experiment.py"
    experiment_file.write_text(FAKE_EXPERIMENT)
    suite = tmp_path / "suite.json"
    suite.write_text(SUITE)
    results = tmp_path / "results.tsv"
    settings = Settings(gate_seed=3, warmup=1, rounds=1, input_sets=1, gate_random_problems=1)
    code = prepare.run_experiment(
        candidates.load_experiment(experiment_file), str(suite), description="cpu test", proposer="pytest",
        results_path=results, context=CPU, device="cpu", settings=settings,
    )
    out, err = capsys.readouterr()
    assert code == 1  # the d256 problem cannot run on the target
    # the problem the target cannot run: one line naming it and the rule, for each direction
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 2 and all("tiny d256: infeasible: forward config: smem_capacity" in e for e in errors)
    assert all("target=sm120 device=cpu (test) mode=cpu" in e for e in errors)
    # the others ran, and the output ends with exactly the twelve metric lines, after the table
    lines = out.rstrip("\n").splitlines()
    tail = lines[-len(metrics.METRIC_NAMES):]
    assert [line.split(": ")[0] for line in tail] == list(metrics.METRIC_NAMES)
    values = metrics.parse_metric_lines("\n".join(tail))
    # configs: fwd and bwd of d64-causal, fwd of the decode class (ok); fwd and bwd of d256 (infeasible)
    assert values["configs_ok"] == "3/5"
    assert (values["target"], values["device"], values["mode"]) == ("sm120", "cpu (test)", "cpu")
    table_start = next(i for i, line in enumerate(lines) if line.startswith("experiment.py per problem"))
    assert table_start < len(lines) - len(metrics.METRIC_NAMES)
    assert "tiny decode" in out and "smem_capacity" in out
    assert lines[0].startswith("# run: target=sm120 device=cpu (test) mode=cpu")
    (row,) = read_rows(results).rows
    assert (row.proposer, row.description, row.configs_ok, row.status) == ("pytest", "cpu test", "3/5", "infeasible")
    assert row.fwd_tflops_geomean > 0 and row.bwd_tflops_geomean > 0  # (CPU rates: the lines round them to 0.0)
    assert values["fwd_tflops_geomean"] == f"{row.fwd_tflops_geomean:.1f}"
    assert row.config["forward"]["d64-causal-bf16"]["tile_n"] == 128 and row.config["gate_seed"] == 3
    # the spreads are in the row's config JSON (results.tsv keeps its columns), as the lines print them
    for direction in ("fwd", "bwd"):
        assert row.config[f"{direction}_spread_pct"] >= 0
        assert values[f"{direction}_spread_pct"] == f"{row.config[f'{direction}_spread_pct']:.2f}"
    # every problem's timed-call quartiles too, for fa4tune.keep's per-problem decision
    timings = row.config["problems"]
    ok = [t for t in timings.values() if t["status"] == "ok"]
    assert len(timings) == 5 and len(ok) == 3 and timings["fwd tiny d256"]["status"] == "infeasible"
    assert all(t["ms_q1"] <= t["ms_median"] <= t["ms_q3"] for t in ok)
    assert len(row.prepare_sha256) == 64


def test_baseline_plan_keeps_sdpa_and_fa4_where_upstreams_defaults_cannot_run():
    problems = [Problem(1, 64, 64, 2, 2, 256, 256, False, name="d256"), Problem(1, 1, 80, 4, 2, 64, 64, False, backward=False, name="decode")]
    emulated, own_path = baselines.plan_baseline(problems, get_target("sm120"), "experiment.py")
    steps = {(s.direction, s.problem.name): [spec["name"] for spec in s.specs] for s in emulated.steps}
    assert steps == {
        ("fwd", "d256"): ["torch sdpa"],  # upstream's 128x64 tile for d256 needs 131072 B: not run
        ("bwd", "d256"): ["torch sdpa"],
        ("fwd", "decode"): ["sm120 upstream", "torch sdpa"],  # decode has no backward
    }
    infeasible = [p for p in emulated.planned if p.result is not None]
    assert [(p.candidate, p.direction, p.problem.name, p.result.status) for p in infeasible] == [
        ("sm120 upstream", "fwd", "d256", "infeasible"), ("sm120 upstream", "bwd", "d256", "infeasible")]
    assert [(s.direction, s.problem.name, s.specs[0]["name"]) for s in own_path.steps] == [
        ("fwd", "d256", "fa4 own path"), ("fwd", "decode", "fa4 own path"), ("bwd", "d256", "fa4 own path")]
    upstream_decode = next(s for s in emulated.steps if s.problem.name == "decode").specs[0]
    assert upstream_decode["fwd_config"] == {"tile_m": 128, "tile_n": 128, "num_threads": 128, "num_stages": 1, "Q_in_regs": False, "kernel": "sm120"}


def test_a_step_that_returned_nothing_is_reported_not_dropped():
    problems = [Problem(1, 64, 64, 2, 2, 64, 64, False, backward=False, name="p")]
    emulated, _ = baselines.plan_baseline(problems, get_target("sm120"), "experiment.py")
    emulated.fill([{}])
    assert {p.candidate: p.result.status for p in emulated.planned} == {"sm120 upstream": "crash", "torch sdpa": "crash"}
    by_candidate = emulated.measurements(CPU)
    assert set(by_candidate) == {"sm120 upstream", "torch sdpa"}
    assert by_candidate["torch sdpa"][0].status == "crash"


def test_self_check_candidates_fail_where_planted(monkeypatch):
    import torch

    torch.set_num_threads(1)
    small = Problem(1, 48, 48, 4, 2, 32, 32, True, name="small gqa causal")
    settings = Settings(gate_seed=5, gate_random_problems=1)
    # the unwritten-output plants rely on the CUDA allocator's poisoned blocks: a stand-in allocator here, whose
    # torch.empty blocks read as NaN once the gate has poisoned it before the call (0 before: a fresh block)
    poisoned = []
    monkeypatch.setattr(gate, "poisons", lambda device: True)
    monkeypatch.setattr(gate, "poison_cuda_allocator", lambda nbytes, device: poisoned.append(list(nbytes)))
    real_empty, real_empty_like = torch.empty, torch.empty_like

    def empty(*args, **kwargs):
        return real_empty(*args, **kwargs).fill_(float("nan") if poisoned else 0.0)

    def empty_like(t, **kwargs):
        return real_empty_like(t, **kwargs).fill_(float("nan") if poisoned else 0.0)

    verdicts, reasons = {}, {}
    for candidate, should_pass in self_check.planted_candidates():
        poisoned.clear()
        with monkeypatch.context() as m:
            m.setattr(torch, "empty", empty)
            m.setattr(torch, "empty_like", empty_like)
            passed, _, reasons[candidate.name] = steps.gate_candidate(candidate, small, "fwd", "cpu", settings)
        verdicts[candidate.name] = (passed, should_pass)
    assert {"unwritten output", "half-written output"} <= set(verdicts)
    assert all(passed == expected for passed, expected in verdicts.values()), verdicts
    assert "never written" in reasons["unwritten output"] and "never written" in reasons["half-written output"]
    assert steps.gate_candidate(candidates.sdpa_candidate(), small, "bwd", "cpu", settings)[0]
