"""Optuna samplers by name. All three read the feasibility constraint that each trial sets.

The default is TPE, by measurement (docs/measurements/2026-11-29-search-bench.md): on the H200 forward sweep TPE and
GP tie (median 12 evaluated configs to 99% of the best, random 20.5; 9 and 10 after upstream's default as the first
trial, as `search run` does), and TPE proposes in milliseconds where GP takes about a second on a CPU.
"""

from __future__ import annotations

import optuna

from fa4tune.config import ConfigError

SAMPLERS = ("tpe", "gp", "random")
DEFAULT_SAMPLER = "tpe"


def make_sampler(name: str, seed: int | None = None) -> optuna.samplers.BaseSampler:
    """A fresh sampler; a one-line error for an unknown name."""
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "tpe":
        # multivariate: the knobs interact (the shared-memory rule couples tiles, stages and Q_in_regs).
        # constant_liar: trials in flight (the run's slots) count as bad guesses, so parallel asks spread out
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=8, constant_liar=True)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=8, deterministic_objective=False)
    raise ConfigError("sampler", f"sampler must be one of {', '.join(SAMPLERS)}, got {name!r}")
