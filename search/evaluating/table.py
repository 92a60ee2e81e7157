"""Recorded tables: per-(problem class, config) measurements, loaded from JSON or CSV.

JSON (what a sweep writes with `save_table`):

    {"format": "fa4tune-replay-table/1", "synthetic": false, "device": "...", "mode": "emulated",
     "target": "sm120", "command": "...", "date": "...",
     "problems": [Problem.to_dict(), ...],            # optional
     "measurements": [Measurement.to_dict(), ...]}

A bare JSON list of Measurement dicts is accepted too. CSV: one row per (config, problem) with the
columns kind, problem_class, the config's knob names, problem, status, tflops and optionally reason,
device, mode, target.
"""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

from fa4tune.config import ConfigError, Problem
from fa4tune.harness.measurement import Measurement, ProblemResult
from search.space import Space, get_space

TABLE_FORMAT = "fa4tune-replay-table/1"
_CSV_RESULT_COLUMNS = ("kind", "problem_class", "problem", "status", "tflops", "reason", "device", "mode", "target")


class ReplayTable:
    """Measurements keyed by (kind, problem class name, config key)."""

    def __init__(self, measurements: list[Measurement], meta: dict | None = None, path: str = ""):
        self.meta = dict(meta or {})
        self.path = path
        self.recorded_problems = [Problem.from_dict(p) for p in self.meta.get("problems", [])]  # may be empty
        self.entries: dict[tuple, Measurement] = {}
        for m in measurements:
            config = get_space(m.kind).config(m.config)
            self.entries[(m.kind, m.problem_class, config.key())] = m

    @property
    def name(self) -> str:
        """How the table is named in statuses and reports (its file name)."""
        return Path(self.path).name if self.path else "in-memory table"

    @property
    def synthetic(self) -> bool:
        return bool(self.meta.get("synthetic"))

    def space(self, kind: str) -> Space:
        """The direction's space narrowed to the knob values this table measured (e.g. one kernel class of two):
        a replayed search then proposes no config that only a missing knob value would make unanswerable."""
        space = get_space(kind)
        seen = {name: set() for name in space.domain}
        for (k, _, _), m in self.entries.items():
            if k == kind:
                for name, value in space.config(m.config).to_dict().items():
                    if name in seen:
                        seen[name].add(value)
        # a knob the table never set (the own knob of a kernel class it did not measure) keeps one value: a domain
        # must not be empty, and the configs of the table's classes drop it anyway
        return replace(space, domain={name: tuple(v for v in values if v in seen[name]) or values[:1]
                                      for name, values in space.domain.items()})

    def lookup(self, kind: str, problem_class: str, config) -> Measurement | None:
        """The recorded measurement of a config, or None."""
        return self.entries.get((kind, problem_class, config.key()))

    def problem_classes(self, kind: str) -> list[str]:
        """Problem class names that have measurements of this kind, in first-seen order."""
        return list(dict.fromkeys(pc for (k, pc, _) in self.entries if k == kind))

    def measurements(self, kind: str, problem_class: str) -> list[Measurement]:
        """All recorded measurements of one problem class."""
        return [m for (k, pc, _), m in self.entries.items() if k == kind and pc == problem_class]

    def best(self, kind: str, problem_class: str) -> float | None:
        """The highest geomean TFLOPS of a problem class among configs that passed (None if none did)."""
        values = [m.geomean_tflops() for m in self.measurements(kind, problem_class) if m.ok]
        return max(values) if values else None

    def problems(self, problem_class: str) -> list[Problem]:
        """The recorded Problem records of a class (empty when the table does not list them)."""
        return [p for p in self.recorded_problems if p.problem_class.name == problem_class]


def load_table(path: str) -> ReplayTable:
    """A recorded table from a .json or .csv file; one-line errors for a missing or malformed file."""
    file = Path(path)
    if not file.exists():
        raise ConfigError("table_file", f"table {path!r} does not exist")
    try:
        if file.suffix == ".csv":
            measurements, meta = _read_csv(file), {}
        else:
            data = json.loads(file.read_text())
            if isinstance(data, list):
                data = {"measurements": data}
            meta = {k: v for k, v in data.items() if k != "measurements"}
            measurements = [Measurement.from_dict(m) for m in data["measurements"]]
        return ReplayTable(measurements, meta, str(file))
    except ConfigError as err:
        raise ConfigError("table_file", f"malformed table {path!r}: {err}")
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise ConfigError("table_file", f"malformed table {path!r}: {type(err).__name__}: {err}")


def save_table(path: str, measurements: list[Measurement], **meta) -> None:
    """Writes a JSON table (meta: device, mode, target, command, date, synthetic, problems ...)."""
    data = {"format": TABLE_FORMAT, **meta, "measurements": [m.to_dict() for m in measurements]}
    Path(path).write_text(json.dumps(data, indent=1) + "\n")


def _read_csv(file: Path) -> list[Measurement]:
    groups: dict[tuple, dict] = {}
    with file.open(newline="") as f:
        for row in csv.DictReader(f):
            space = get_space(row["kind"])
            knobs = {name: _parse_knob(row[name]) for name in space.config_class.__dataclass_fields__ if name in row}
            config = space.config(knobs)
            key = (row["kind"], row["problem_class"], config.key())
            group = groups.setdefault(key, {"config": config.to_dict(), "row": row, "results": []})
            tflops = float(row["tflops"]) if row.get("tflops") not in (None, "") else None
            group["results"].append(
                ProblemResult(row["problem"], row["kind"], row["status"], tflops=tflops, reason=row.get("reason") or "")
            )
    return [
        Measurement(
            kind=key[0], problem_class=key[1], config=g["config"], results=tuple(g["results"]),
            target=g["row"].get("target") or "", device=g["row"].get("device") or "",
            mode=g["row"].get("mode") or "", evaluator="table",
        )
        for key, g in groups.items()
    ]


def _parse_knob(text: str):
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    try:
        return int(text)
    except ValueError:
        return text

