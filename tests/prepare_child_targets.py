"""Functions the prepare.py tests run in child processes (importable as `tests.prepare_child_targets`).

No top-level torch import: the children of the plain-function tests start in a fraction of a second."""

from __future__ import annotations

import math
import os
import signal
import time


# --- plain functions for fa4tune.harness.isolation --------------------------------------------------------


def add(a, b):
    return a + b


def count_then_segfault(n):
    for i in range(n):
        yield i
    os.kill(os.getpid(), signal.SIGSEGV)


def start_then_hang():
    yield "started"
    time.sleep(3600)


def hang_with_worker():
    """Starts a grandchild that would outlive a plain kill; the process-group kill must end it too."""
    import subprocess
    import sys

    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    yield worker.pid
    time.sleep(3600)


def exit_code(code):
    os._exit(code)


def raise_error():
    raise RuntimeError("CUDA error: an illegal memory access was encountered (planted)")


# --- a CPU attention "kernel" with experiment.attention's signature ---------------------------------


def torch_attention(q, k, v, causal=False, softmax_scale=None, fwd_config=None, bwd_config=None, return_lse=False):
    """softmax(q k^T) v computed in fp32 and rounded to the input dtype (differentiable)."""
    import torch  # here, not at the top: the plain functions' children start without torch

    group = q.shape[2] // k.shape[2]
    scale = softmax_scale or 1.0 / math.sqrt(q.shape[-1])
    kk = k.float().repeat_interleave(group, dim=2)
    vv = v.float().repeat_interleave(group, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), kk) * scale
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        mask = torch.arange(sk)[None, :] > torch.arange(sq)[:, None] + (sk - sq)
        scores = scores.masked_fill(mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(scores, dim=-1), vv).to(q.dtype)
    return (out, lse) if return_lse else out


def _candidate(name, forward):
    from fa4tune.harness import candidates

    return candidates.Candidate(name, forward, {"test": name})


def correct_candidate():
    return _candidate("correct", lambda q, k, v, causal: torch_attention(q, k, v, causal, return_lse=True))


def segfault_candidate():
    def forward(q, k, v, causal):
        os.kill(os.getpid(), signal.SIGSEGV)

    return _candidate("segfault", forward)


def hang_candidate():
    def forward(q, k, v, causal):
        time.sleep(3600)

    return _candidate("hang", forward)


def wrong_candidate():
    def forward(q, k, v, causal):
        out, lse = torch_attention(q, k, v, causal, return_lse=True)
        return out * 1.5, lse

    return _candidate("wrong", forward)


def context_lost_candidate():
    """Reports a device fault, as a kernel that made the CUDA context unusable does."""

    def forward(q, k, v, causal):
        raise RuntimeError("CUDA error: an illegal memory access was encountered (planted)")

    return _candidate("context_lost", forward)


def slow_candidate():
    """Correct, and 100 ms per call: a config the give-up threshold stops."""

    def forward(q, k, v, causal):
        time.sleep(0.1)
        return torch_attention(q, k, v, causal, return_lse=True)

    return _candidate("slow", forward)


REFERENCE_LOG = "FA4TUNE_TEST_REFERENCE_LOG"


def counting_candidate():
    """Correct; every reference the gate computes in this process from now on adds a line (the process id)
    to the file $FA4TUNE_TEST_REFERENCE_LOG."""
    from fa4tune.harness import gate

    if not getattr(gate.reference_attention, "counted", False):
        compute = gate.reference_attention

        def reference_attention(*args, **kwargs):
            with open(os.environ[REFERENCE_LOG], "a") as log:
                log.write(f"{os.getpid()}\n")
            return compute(*args, **kwargs)

        reference_attention.counted = True
        gate.reference_attention = reference_attention
    return _candidate("counting", lambda q, k, v, causal: torch_attention(q, k, v, causal, return_lse=True))
