"""The guardrails on a real GPU: an honest kernel and experiment.attention pass them, a side-stream cheat is caught,
and what the guards cost per (problem, direction) next to the gate.

    FLASH_ATTENTION_ARCH=sm_120 FLASH_ATTENTION_NUM_SMS=<SMs> python3 bench/guards_gpu.py

Not a test (CI has no GPU): a script that prints a table; the CPU tests (tests/test_guards.py) use a fake stream.
"""

import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from fa4tune.config import Problem  # noqa: E402
from fa4tune.harness import candidates, guards, runtime_guards, steps  # noqa: E402
from fa4tune.harness.settings import EXPERIMENT_PATH, Settings  # noqa: E402

SETTINGS = Settings(gate_seed=1234)
PROBLEMS = [
    Problem(1, 2048, 2048, 32, 8, 128, 128, True, name="gqa causal 2k"),
    Problem(2, 1024, 1024, 16, 16, 64, 64, False, name="d64 1k"),
    Problem(1, 1, 4096, 32, 8, 128, 128, False, backward=False, name="decode 4k"),
]


def einsum_attention(q, k, v, causal):
    """Plain torch math (fp32 scores): an honest, slow kernel."""
    group = q.shape[2] // k.shape[2]
    kk, vv = k.repeat_interleave(group, dim=2).float(), v.repeat_interleave(group, dim=2).float()
    scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), kk) / math.sqrt(q.shape[-1])
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        mask = torch.arange(sk, device=q.device)[None, :] > torch.arange(sq, device=q.device)[:, None] + (sk - sq)
        scores = scores.masked_fill(mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    return torch.einsum("bhqk,bkhd->bqhd", torch.softmax(scores, dim=-1), vv).to(q.dtype), lse


SIDE = None


def side_stream_attention(q, k, v, causal):
    """Runs on a stream made before the trap, switched to behind torch.cuda.set_stream's back, and returns
    without making the caller's stream wait: only the readiness check can see it."""
    current = torch.cuda.current_stream()
    SIDE.wait_stream(current)
    torch._C._cuda_setStream(stream_id=SIDE.stream_id, device_index=SIDE.device_index, device_type=SIDE.device_type)
    try:
        out, lse = einsum_attention(q, k, v, causal)
    finally:
        torch._C._cuda_setStream(stream_id=current.stream_id, device_index=current.device_index, device_type=current.device_type)
    return out, lse


def verdict(forward, problem, direction) -> tuple[str, float]:
    """('pass' or the violation, seconds) of the run-time guards alone, under the trap."""
    start = time.perf_counter()
    try:
        with runtime_guards.attention_trap():
            runtime_guards.check_candidate(forward, problem, direction, "cuda", seed=99)
        result = "pass"
    except guards.GuardViolation as err:
        result = str(err).split(" (")[0]
    torch.cuda.synchronize()
    return result, time.perf_counter() - start


def main() -> int:
    global SIDE
    SIDE = torch.cuda.Stream()
    experiment = candidates.load_experiment(EXPERIMENT_PATH)
    print(f"device: {torch.cuda.get_device_name()}; SM120 kernels emulated unless this is an SM120 GPU")
    print(f"{'problem':<16} {'dir':<4} {'candidate':<20} {'gate s':>7} {'guards s':>9}  verdict")
    surprises = 0
    for problem in PROBLEMS:
        pc = problem.problem_class
        real = candidates.experiment_candidate(experiment, experiment.forward_config(pc), experiment.backward_config(pc))
        for direction in ("fwd", "bwd") if problem.backward else ("fwd",):
            start = time.perf_counter()
            passed, _, reason = steps._gate_cases(real, problem, direction, "cuda", SETTINGS)  # compiles, then the gate alone
            gate_s = time.perf_counter() - start
            result, guard_s = verdict(real.forward, problem, direction) if passed else (f"gate failed: {reason}", 0.0)
            surprises += result != "pass"
            print(f"{problem.name:<16} {direction:<4} {'experiment.attention':<20} {gate_s:7.2f} {guard_s:9.2f}  {result}")
        if problem.seqlen_q > 1:
            for name, forward, expected in (("einsum (honest)", einsum_attention, "pass"),
                                            ("side stream (cheat)", side_stream_attention, "guard not_ready")):
                result, guard_s = verdict(forward, problem, "fwd")
                surprises += not result.startswith(expected)
                print(f"{problem.name:<16} {'fwd':<4} {name:<20} {'':>7} {guard_s:9.2f}  {result}")
    print(f"guards_gpu: {'ok' if not surprises else f'{surprises} unexpected'}")
    return 0 if not surprises else 1


if __name__ == "__main__":
    sys.exit(main())
