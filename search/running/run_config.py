"""Settings of `python -m search run`: defaults, then a config file (TOML or JSON), then the command line.

Every value is type-checked before anything is opened, so a wrong type is a one-line error and the
storage stays untouched.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from fa4tune.config import ConfigError
from search.evaluating.protocol import AUTO
from search.evaluating.pruning import DEFAULT_FACTOR
from search.proposing.prompt import DEFAULT_MODEL
from search.proposing.samplers import DEFAULT_SAMPLER
from search.storing.storage import DEFAULT_STORAGE

TRANSFER_TABLE = "search/data/h200_sweep.json"  # the shipped sweep (relative to the project root)


@dataclass
class RunConfig:
    """Everything a run needs; field names are the config file's keys (dashes allowed)."""

    storage: str = DEFAULT_STORAGE
    suite: str = "standard"
    directions: list = field(default_factory=lambda: ["fwd", "bwd"])
    problem_classes: list = field(default_factory=list)  # empty: every class of the suite
    target: str = "sm120"
    n_trials: int = 40
    sampler: str = DEFAULT_SAMPLER
    seed: int = 0
    proposer: str = "claude"  # "claude" or "none"
    model: str = DEFAULT_MODEL
    k: int = 4
    ratio: str = "1:1"  # sampler:proposer trials
    policy: str = "fixed"  # "fixed" or "adaptive"
    window: int = 10  # the adaptive policy's look-back, in trials
    api_timeout: float = 60.0
    api_retries: int = 3
    api_backoff: float = 2.0
    evaluator: str = "gpu"  # "gpu" or "replay"
    table: str = ""  # the recorded table of the replay evaluator
    replay_delay: float = 0.0  # seconds the replay evaluator waits per config
    confirmations: int = 2
    tolerance: float = 0.05
    baseline: bool = True
    transfer_table: str = TRANSFER_TABLE  # a GPU run's new studies try this table's other classes' best first ("": none)
    prune_factor: float = DEFAULT_FACTOR  # a config this much slower than the study's best is pruned (0: never)
    compile_jobs: int = AUTO  # CPU compile processes ahead of the GPU (-1: cores - 1; 0: compile on the GPU's turn)
    slots: int = 0  # trials in flight (0: what the evaluator can use)
    results: str = "results.tsv"  # "" writes no rows
    description: str = ""


_TYPES = {int: "an integer", float: "a number", str: "a string", bool: "true or false", list: "a list of strings"}


def _check_type(name: str, value: Any, expected: type, source: str) -> Any:
    ok = {
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        str: isinstance(value, str),
        bool: isinstance(value, bool),
        list: isinstance(value, list) and all(isinstance(v, str) for v in value),
    }[expected]
    if not ok:
        raise ConfigError("run_config_type", f"{source}: {name} must be {_TYPES[expected]}, got {value!r}")
    return float(value) if expected is float else value


def _field_types() -> dict[str, type]:
    hints = {"int": int, "float": float, "str": str, "bool": bool, "list": list}
    return {f.name: hints[str(f.type)] for f in fields(RunConfig)}


def load_file(path: str) -> dict:
    """Values of a .toml or .json config file, checked against RunConfig's fields and types."""
    file = Path(path)
    if not file.exists():
        raise ConfigError("run_config_file", f"config file {path!r} does not exist")
    try:
        data = tomllib.loads(file.read_text()) if file.suffix == ".toml" else json.loads(file.read_text())
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as err:
        raise ConfigError("run_config_file", f"config file {path!r} is not valid {file.suffix[1:] or 'JSON'}: {err}")
    if not isinstance(data, dict):
        raise ConfigError("run_config_file", f"config file {path!r} must hold a table of settings")
    return check_values({k.replace("-", "_"): v for k, v in data.items()}, f"config file {path}")


def check_values(values: dict, source: str) -> dict:
    """Rejects unknown keys and wrong types by name."""
    types = _field_types()
    checked = {}
    for name, value in values.items():
        if name not in types:
            raise ConfigError("run_config_key", f"{source}: unknown setting {name!r} (settings: {', '.join(types)})")
        checked[name] = _check_type(name, value, types[name], source)
    if checked.get("compile_jobs", 0) < 0:  # AUTO (-1) is the default's marker, not a value to give
        raise ConfigError("run_config_value", f"{source}: compile_jobs must be >= 0 (leave it out for every core but one), "
                                              f"got {checked['compile_jobs']}")
    return checked


def build(file_values: dict, cli_values: dict) -> RunConfig:
    """Defaults < file < command line (None on the command line means 'not given')."""
    merged = {**file_values, **{k: v for k, v in cli_values.items() if v is not None}}
    return RunConfig(**check_values(merged, "settings"))
