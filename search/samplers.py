"""Optuna samplers by name. All three read the feasibility constraint that each trial sets.

The default is chosen by `python -m search bench` (docs/measurements/), not by habit.
"""

from __future__ import annotations

import importlib.util

import optuna

from fa4tune.config import ConfigError

SAMPLERS = ("tpe", "gp", "random")
DEFAULT_SAMPLER = "tpe"


def make_sampler(name: str, seed: int | None = None) -> optuna.samplers.BaseSampler:
    """A fresh sampler; one-line errors for unknown names and missing dependencies."""
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "tpe":
        # multivariate: the knobs interact (the shared-memory rule couples tiles, stages and Q_in_regs).
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=8)
    if name == "gp":
        if importlib.util.find_spec("scipy") is None:
            raise ConfigError("sampler_dependency", "the gp sampler needs scipy, which is not installed (use --sampler tpe)")
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=8, deterministic_objective=False)
    raise ConfigError("sampler", f"sampler must be one of {', '.join(SAMPLERS)}, got {name!r}")
