"""Packed (varlen) problems in the harness (issue 42 item 3): a suite row names its sequences, the gate checks each
sequence against its own reference (packed gate cases: shortened sequences, random batches), the run-time guards
and the timed-output check run on packed calls, FLOPs are the sequences' sum, and the dispatch table's varlen
entry is what prepare.py runs (CPU tensors and fakes: fa4tune.harness.steps.measure_step as a step child runs it)."""

import json

import pytest
import torch

import experiment
import prepare
from fa4tune.config import ConfigError, ForwardConfig, Problem
from fa4tune.harness import candidates, evaluation, flops, gate, steps
from fa4tune.harness.settings import Settings
from fa4tune.suites import load_suite
from fa4tune.targets import get_target
from prepare_child_targets import torch_attention

torch.set_num_threads(1)

SETTINGS = Settings(gate_seed=5, warmup=1, rounds=2, input_sets=2, gate_random_problems=2)
LENGTHS = (40, 7, 25)
PACKED = gate.packed_problem(Problem(1, 1, 1, 4, 2, 32, 32, True, name="x"), LENGTHS)


def per_sequence(q, k, v, causal, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None):
    """An honest packed forward: each sequence alone, LSE (heads, total) as upstream's varlen path returns it."""
    assert cu_seqlens_q is not None and max_seqlen_q == max(int(n) for n in cu_seqlens_q.diff())
    bounds = cu_seqlens_q.tolist()
    outs, lses = zip(*(torch_attention(q[a:b][None], k[a:b][None], v[a:b][None], causal, return_lse=True)
                       for a, b in zip(bounds, bounds[1:])))
    return torch.cat([o[0] for o in outs]), torch.cat([lse[0] for lse in lses], dim=1)


def leaky(q, k, v, causal, **packed):
    """The whole pack as one sequence: each sequence sees the keys of those before it."""
    out, lse = torch_attention(q[None], k[None], v[None], causal, return_lse=True)
    return out[0], lse[0]


def _guarded(forward, name="packed"):
    return candidates.Candidate(name, forward, {}, guarded=True)


def test_a_suite_row_names_its_sequences_and_bad_lengths_get_one_error_naming_the_rule(tmp_path):
    problems = load_suite("varlen")
    assert len(problems) == 6 and all(p.lengths for p in problems)
    first = problems[0]
    assert (first.batch, first.seqlen_q, first.seqlen_k) == (8, 3072, 3072) and first.problem_class.name == "d128-causal-gqa4-bf16"
    assert Problem.from_dict(json.loads(json.dumps(first.to_dict()))) == first  # how a step travels to its child
    row = {"name": "p", "num_heads": 4, "num_heads_kv": 4, "head_dim": 64, "causal": True}
    for lengths, words in (([3, 0], "positive"), (["3"], "positive")):
        path = tmp_path / "bad.json"
        path.write_text(json.dumps({"problems": [{**row, "lengths": lengths, "batch": 1, "seqlen_q": 3, "seqlen_k": 3}]}))
        with pytest.raises(ConfigError, match="packed_lengths") as err:
            load_suite(str(path))
        assert words in str(err.value)
    with pytest.raises(ConfigError, match=r"packed_lengths: .*\(2, 9, 9\), got \(2, 9, 4\)"):
        Problem(2, 9, 4, 4, 4, 64, 64, True, lengths=(9, 3))


def test_flops_of_a_packed_problem_are_its_sequences_sum():
    each = [flops.problem_flops(Problem(1, n, n, 4, 2, 32, 32, True), "bwd") for n in LENGTHS]
    assert flops.problem_flops(PACKED, "bwd") == pytest.approx(sum(each))
    assert flops.problem_flops(PACKED, "bwd") < flops.problem_flops(Problem(3, 40, 40, 4, 2, 32, 32, True), "bwd")


def test_the_gate_cases_of_a_packed_problem_are_packed():
    cases = gate.gate_cases(PACKED, 3, random_count=2)
    assert [c.variant.split(" ")[0] for c in cases] == ["normal", "scaled", "lengths-37", "random", "random"]
    assert cases[2].problem.lengths == (3, 1, 1)  # each sequence shortened, none below 1
    for case in cases[3:]:
        assert 2 <= len(case.problem.lengths) <= 4 and max(case.problem.lengths) <= 40
        assert case.problem.problem_class == PACKED.problem_class
    q, k, v, dout = gate.random_inputs(PACKED, 0, "cpu", count=4)
    assert q.shape == (72, 4, 32) and k.shape == (72, 2, 32) and dout.shape == (72, 4, 32)


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_an_honest_packed_candidate_is_gated_guarded_and_timed_and_a_leaking_one_fails_naming_the_sequence(direction):
    results = steps.measure_step(PACKED, direction, [_guarded(per_sequence), _guarded(leaky, "leaky")], device="cpu",
                                 settings=SETTINGS)
    ok, leak = results["packed"], results["leaky"]
    assert ok.status == "ok" and ok.tflops > 0 and ok.max_errors["gate_cases"] == 5, ok
    # forward: the second sequence is the first to see another's keys; backward: the first's dK, dV get the others' rows
    named = "sequence 1 of 3 (length 7)" if direction == "fwd" else "sequence 0 of 3 (length 40)"
    assert leak.status == "incorrect" and named in leak.reason, leak


def test_a_packed_call_in_the_sdpa_baseline_runs_each_sequence_alone():
    q, k, v = gate.random_inputs(PACKED, 1, "cpu", count=3)
    result = gate.gate_forward(candidates.sdpa_candidate().forward, q, k, v, True, lengths=LENGTHS)
    assert result.passed, result.reason


def test_prepare_runs_the_varlen_entry_and_a_class_that_cannot_pack_is_infeasible_naming_the_rule():
    target = get_target("sm120")
    problems = load_suite("varlen")
    plan = prepare.plan_experiment(experiment, problems, target, "experiment.py")
    forwards = [p for p in plan.planned if p.direction == "fwd"]
    for planned, problem in zip(forwards, problems):
        assert planned.config == experiment.varlen_forward_config(problem.problem_class).to_dict()
        assert planned.result is None, planned.result  # feasible: the varlen entries run on a class that packs
    gqa = problems[0]
    assert experiment.forward_config(gqa.problem_class).kernel != "sm120"  # the plain entry is a TMA class that cannot
    tma = ForwardConfig(tile_m=128, tile_n=64, num_threads=128, num_stages=1, Q_in_regs=False, kernel="sm120_tma")
    failure = evaluation.feasibility_failure("fwd", tma, experiment.backward_config(gqa.problem_class), gqa, target)
    assert failure.startswith("forward config: varlen_kernel: kernel 'sm120_tma' does not run packed batches")


def test_each_sequence_s_reference_is_cached_on_its_own_and_served_again():
    q, k, v = gate.random_inputs(PACKED, 2, "cpu", count=3)
    cache = gate.ReferenceCache(1 << 30)
    for _ in range(2):
        result = gate.gate_forward(per_sequence, q, k, v, True, seed=2, references=cache, lengths=LENGTHS)
        assert result.passed, result.reason
        assert len(cache) == len(LENGTHS)  # one entry per sequence, the second pass served from them


def test_the_sdpa_baseline_reads_a_packed_calls_offsets_to_the_host_once():
    # each timed call's device-to-host copy made the timing refuse the SDPA varlen rows (and the upstream rows
    # interleaved with them): 2026-12-06-h100-models-twins-varlen.md
    from torch.overrides import TorchFunctionMode

    class Reads(TorchFunctionMode):
        count = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            Reads.count += getattr(func, "__name__", "") == "tolist"
            return func(*args, **(kwargs or {}))

    q, k, v = gate.random_inputs(PACKED, 1, "cpu", count=3)
    cu = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()], dtype=torch.int32)
    forward = candidates.sdpa_candidate().forward
    with Reads():
        first = forward(q, k, v, True, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(LENGTHS), max_seqlen_k=max(LENGTHS))
        for _ in range(3):
            again = forward(q, k, v, True, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(LENGTHS), max_seqlen_k=max(LENGTHS))
    assert Reads.count == 1 and torch.equal(first[0], again[0])


def test_a_packed_forward_right_on_its_longest_sequence_alone_once_its_offsets_repeat_is_caught_after_timing():
    """A cheat of the lead's own (issue 66, s14's review of the drawn sequence): the timed calls reuse one offsets
    tensor through warm-up and every round, the guards call each set at most twice, so from the third call on one
    cu_seqlens object the forward computes the longest sequence alone and hands the others the rows it returned the
    first time (stale once the round rewrites the inputs). It passes the gate and the guards; the check after timing
    catches it, whole on one set and, on the others, on the rows of a sequence drawn after the call."""
    seen: dict[int, list] = {}

    def longest_only(q, k, v, causal, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None):
        packed = dict(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                      max_seqlen_k=max_seqlen_k)
        entry = seen.setdefault(id(cu_seqlens_q), [cu_seqlens_q, 0, None])  # the tensor kept: its id stays its own
        entry[1] += 1
        if entry[1] < 3:
            entry[2] = per_sequence(q, k, v, causal, **packed)
            return entry[2]
        bounds = cu_seqlens_q.tolist()
        i = max(range(len(bounds) - 1), key=lambda j: bounds[j + 1] - bounds[j])
        a, b = bounds[i], bounds[i + 1]
        out, lse = (t.clone() for t in entry[2])
        o, s = torch_attention(q[a:b][None], k[a:b][None], v[a:b][None], causal, return_lse=True)
        out[a:b], lse[:, a:b] = o[0], s[0]
        return out, lse

    results = steps.measure_step(PACKED, "fwd", [_guarded(per_sequence), _guarded(longest_only, "longest only")],
                                 device="cpu", settings=SETTINGS)
    assert results["packed"].status == "ok", results["packed"]
    caught = results["longest only"]
    # its stale rows follow the values the set held before the round rewrote it: output_reuse, or plainly wrong
    assert caught.status in ("guard", "incorrect") and "checked after timing" in caught.reason, caught
    assert "output_reuse" in caught.reason or "> tolerance" in caught.reason, caught
