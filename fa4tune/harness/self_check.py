"""Self-check on the GPU (`prepare.py --self-check`): the gate passes a correct kernel and catches planted faults,
and timing one kernel as two candidates shows the timer's run-to-run spread."""

from __future__ import annotations

from fa4tune.config import ConfigError, Problem
from fa4tune.harness import timing
from fa4tune.harness.candidates import TORCH_SDPA, Candidate, sdpa_candidate
from fa4tune.harness.runs import error, run_context
from fa4tune.harness.settings import Settings, new_gate_seed
from fa4tune.harness.steps import gate_candidate, make_flusher, timed_calls

SELF_CHECK_PROBLEM = Problem(1, 2048, 2048, 16, 4, 128, 128, True, backward=True, name="self-check b1 s2048 hq16/hkv4 d128 causal")


def planted_candidates() -> list[tuple[Candidate, bool]]:
    """(candidate, should pass): torch SDPA, and SDPA with planted faults the gate must catch."""
    import torch

    sdpa = sdpa_candidate()

    def unwritten(q, k, v, causal):
        # allocated after the gate poisoned the allocator; the kernel "forgets" to write it
        return torch.empty(q.shape[:3] + (v.shape[-1],), dtype=q.dtype, device=q.device), None

    def half_written(q, k, v, causal):
        out, _ = sdpa.forward(q, k, v, causal)
        partial = torch.empty_like(out)
        partial[:, : out.shape[1] // 2] = out[:, : out.shape[1] // 2]
        return partial, None

    def one_wrong(q, k, v, causal):
        out, _ = sdpa.forward(q, k, v, causal)
        out = out.clone()
        out[0, -1, 0, 0] += 0.25
        return out, None

    def one_nan(q, k, v, causal):
        out, _ = sdpa.forward(q, k, v, causal)
        out = out.clone()
        out[0, 0, -1, -1] = float("nan")
        return out, None

    def top_left_causal(q, k, v, causal):
        import torch.nn.functional as F

        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal, enable_gqa=True)
        return out.transpose(1, 2), None

    return [
        (sdpa, True),
        (Candidate("unwritten output", unwritten, {}), False),
        (Candidate("half-written output", half_written, {}), False),
        (Candidate("one element +0.25", one_wrong, {}), False),
        (Candidate("one NaN", one_nan, {}), False),
        (Candidate("top-left causal (wrong when sq != sk)", top_left_causal, {}), False),
    ]


def run_self_check() -> int:
    """Show on this GPU that the gate passes a correct kernel and fails planted faults, and measure the
    run-to-run spread of timing one kernel as two candidates."""
    try:
        context = run_context()
    except ConfigError as err:
        error(str(err))
        return 2
    settings = Settings(gate_seed=new_gate_seed())
    print(f"# self-check: {context.label}; gate seed {settings.gate_seed}", flush=True)
    problem = SELF_CHECK_PROBLEM
    surprises = 0
    for candidate, should_pass in planted_candidates():
        for direction in ("fwd", "bwd") if candidate.name == TORCH_SDPA else ("fwd",):
            passed, _, reason = gate_candidate(candidate, problem, direction, "cuda", settings)
            verdict = "as expected" if passed == should_pass else "UNEXPECTED"
            surprises += passed != should_pass
            print(f"gate {direction} {candidate.name}: {'pass' if passed else 'fail'} ({verdict}) {reason} [{context.label}]", flush=True)
    # Time one kernel as two candidates, interleaved, in two separate runs: the medians' spread is the
    # noise floor, and the keep rule must not call either one an improvement on the other.
    sdpa = sdpa_candidate()
    twin = Candidate("torch sdpa (again)", sdpa.forward, {})
    flusher = make_flusher("cuda")
    runs = []
    for run in range(2):
        seeds = [settings.gate_seed + 100 * (run + 1) + i for i in range(settings.input_sets)]
        calls = {c.name: timed_calls(c, problem, "fwd", "cuda", seeds) for c in (sdpa, twin)}
        runs.append(timing.benchmark(calls, timer=timing.CudaEventTimer(), flush=flusher, rounds=settings.rounds, seed=settings.gate_seed + run))
    medians = [r[name].median_ms for r in runs for name in (sdpa.name, twin.name)]
    spread = (max(medians) - min(medians)) / min(medians) * 100
    claimed = timing.is_improvement([r[twin.name] for r in runs], [r[sdpa.name] for r in runs])
    print(
        f"timing one kernel as two candidates in two runs: medians {', '.join(f'{m:.4f}' for m in medians)} ms "
        f"({spread:.2f}% max-min); is_improvement says {claimed} (expected False) [{context.label}]", flush=True,
    )
    surprises += claimed
    print(f"self_check: {'ok' if not surprises else f'{surprises} unexpected'}", flush=True)
    return 0 if not surprises else 1
