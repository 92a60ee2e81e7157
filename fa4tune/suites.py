"""Problem suites as data: JSON files under suites/ (or any path a user gives)."""

from __future__ import annotations

import json
from pathlib import Path

from fa4tune.config import ConfigError, Problem, ProblemClass

SUITES_DIR = Path(__file__).resolve().parent.parent / "suites"
# Keys a suite row may carry for people, not for the kernel: where its figures come from (e.g. suites/models.json cites
# each model's config.json). The loader drops them; any other unknown key is still an error.
CITATION_KEYS = ("source",)


def suite_names() -> list[str]:
    """The suites shipped in suites/."""
    return sorted(p.stem for p in SUITES_DIR.glob("*.json"))


def load_suite(name_or_path: str) -> list[Problem]:
    """Problems of a shipped suite (by name) or of a suite file (by path); one-line errors otherwise."""
    path = Path(name_or_path)
    if not path.suffix:
        path = SUITES_DIR / f"{name_or_path}.json"
        if not path.exists():
            raise ConfigError("unknown_suite", f"suite {name_or_path!r} is not one of {', '.join(suite_names())} (or a .json path)")
    if not path.exists():
        raise ConfigError("suite_file", f"suite file {str(path)!r} does not exist")
    try:
        data = json.loads(path.read_text())
        entries = data["problems"]
        if not isinstance(entries, list) or not entries:
            raise ValueError("'problems' must be a non-empty list")
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise ConfigError("suite_file", f"malformed suite file {str(path)!r}: {err}")
    problems = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ConfigError("suite_file", f"{path}: problem #{i} is not an object")
        entry = {key: value for key, value in entry.items() if key not in CITATION_KEYS}
        entry.setdefault("head_dim_v", entry.get("head_dim"))
        lengths = entry.get("lengths")
        if isinstance(lengths, list) and lengths and all(isinstance(n, int) for n in lengths):
            # a packed row names its sequences; its batch and seqlens follow from them (Problem checks them)
            entry.setdefault("batch", len(lengths))
            entry.setdefault("seqlen_q", max(lengths))
            entry.setdefault("seqlen_k", max(lengths))
        try:
            problems.append(Problem.from_dict(entry))
        except TypeError as err:
            raise ConfigError("suite_file", f"{path}: problem #{i}: {err}")
        except ConfigError as err:
            raise ConfigError("suite_file", f"{path}: problem #{i} ({entry.get('name', '?')}): {err}")
    return problems


def problem_classes(problems: list[Problem]) -> list[ProblemClass]:
    """Distinct problem classes, in first-seen order."""
    seen: dict[ProblemClass, None] = {}
    for p in problems:
        seen.setdefault(p.problem_class, None)
    return list(seen)
