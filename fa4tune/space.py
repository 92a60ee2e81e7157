"""The search space: each knob's domain, and the feasible configs of a problem class on a target."""

from __future__ import annotations

import itertools
from typing import Iterator

from fa4tune.config import BackwardConfig, ForwardConfig, ProblemClass
from fa4tune.feasibility import check_backward, check_forward
from fa4tune.targets import Target

FORWARD_DOMAIN: dict[str, tuple] = {
    "tile_m": (64, 128, 192, 256),
    "tile_n": (32, 64, 96, 128),
    "num_threads": (128, 256),
    "num_stages": (1, 2),
    "Q_in_regs": (False, True),
    # experiment.FORWARD_KERNELS: upstream's cp.async kernel, and the TMA-fed one (num_stages is its pipeline depth)
    "kernel": ("sm120", "sm120_tma"),
}

BACKWARD_DOMAIN: dict[str, tuple] = {
    "m_block_size": (32, 64, 128),
    "n_block_size": (32, 64, 128),
    "num_stages_Q": (1, 2),
    "num_stages_dO": (1, 2),
    "num_threads": (128, 256),
    "SdP_swapAB": (False, True),
    "dKV_swapAB": (False, True),
    "dQ_swapAB": (False, True),
    "AtomLayoutMSdP": (1, 2, 4, 8),
    "AtomLayoutNdKV": (1, 2, 4, 8),
    "AtomLayoutMdQ": (1, 2, 4, 8),
    "V_in_regs": (False, True),
}


def _product(domain: dict[str, tuple]) -> Iterator[dict]:
    names = list(domain)
    for values in itertools.product(*(domain[n] for n in names)):
        yield dict(zip(names, values))


def forward_candidates() -> list[ForwardConfig]:
    """Every forward config of the domain, feasible or not."""
    return [ForwardConfig(**values) for values in _product(FORWARD_DOMAIN)]


def feasible_forward(pc: ProblemClass, target: Target) -> list[ForwardConfig]:
    """Forward configs that pass every static rule for this problem class and target."""
    return [cfg for cfg in forward_candidates() if check_forward(cfg, pc, target)]


def feasible_backward(pc: ProblemClass, target: Target) -> Iterator[BackwardConfig]:
    """Backward configs that pass every static rule (a generator: the product is large)."""
    for values in _product(BACKWARD_DOMAIN):
        cfg = BackwardConfig(**values)
        if check_backward(cfg, pc, target):
            yield cfg
