"""The search space: each knob's domain, and the feasible configs of a problem class on a target.

The forward's `kernel` knob ranges over the registered kernel classes (fa4tune.kernel_class), and each class
adds its own knobs with the domains it declares; a config carries only its own class's.
"""

from __future__ import annotations

import itertools
from typing import Iterator

from fa4tune.config import BackwardConfig, ForwardConfig, ProblemClass
from fa4tune.feasibility import check_backward, check_forward
from fa4tune.kernel_class import forward_kernels
from fa4tune.targets import Target

FORWARD_DOMAIN: dict[str, tuple] = {
    "tile_m": (64, 128, 192, 256),
    "tile_n": (32, 64, 96, 128),
    "num_threads": (128, 256),
    "num_stages": (1, 2),
    "Q_in_regs": (False, True),
}  # upstream's knobs, every kernel class's; forward_domain() adds `kernel` and the classes' own

# A decode class's (fa4tune.config.DECODE_MAX_SEQLEN_Q) values of upstream's knobs: a few query rows per KV head
# (GQA packed into M), so small tiles on one to eight warps, and deeper K/V pipelines; split-KV runs there. Only the
# values some feasible config of the class has are searched (search.space.Space.for_class).
DECODE_FORWARD_DOMAIN: dict[str, tuple] = {
    "tile_m": (16, 32, 64, 128),
    "tile_n": (32, 64, 96, 128),
    "num_threads": (32, 64, 128, 256),
    "num_stages": (1, 2, 3, 4),
    "Q_in_regs": (False, True),
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


def forward_domain(kernels: dict[str, type] | None = None) -> dict[str, tuple]:
    """FORWARD_DOMAIN, then `kernel` (the registered classes' names), then each class's own knobs (a knob two
    classes share gets both domains' values)."""
    kernels = forward_kernels() if kernels is None else kernels
    domain = {**FORWARD_DOMAIN, "kernel": tuple(kernels)}
    for cls in kernels.values():
        for name, values in cls.knobs.items():
            domain[name] = tuple(dict.fromkeys(domain.get(name, ()) + tuple(values)))
    return domain


def forward_candidates(kernels: dict[str, type] | None = None) -> list[ForwardConfig]:
    """Every forward config of the domain, feasible or not: each kernel class with its own knobs."""
    kernels = forward_kernels() if kernels is None else kernels
    configs = []
    for values in _product(FORWARD_DOMAIN):
        for name, cls in kernels.items():  # `kernel` varies fastest, then the class's own knobs
            for own in _product(dict(cls.knobs)):
                configs.append(ForwardConfig.from_dict({**values, "kernel": name, **own}))
    return configs


def feasible_forward(pc: ProblemClass, target: Target) -> list[ForwardConfig]:
    """Forward configs that pass every static rule for this problem class and target."""
    kernels = forward_kernels()
    return [cfg for cfg in forward_candidates(kernels) if check_forward(cfg, pc, target, kernels)]


def feasible_backward(pc: ProblemClass, target: Target, kernel: str = "sm120") -> Iterator[BackwardConfig]:
    """Backward configs of one kernel class (upstream's by default) that pass every static rule (a generator: the
    product is large); a class with knobs of its own is not swept here."""
    for values in _product(BACKWARD_DOMAIN):
        cfg = BackwardConfig(**values, kernel=kernel)
        if check_backward(cfg, pc, target):
            yield cfg
