"""One results.tsv row per trial, through fa4tune.results_tsv when the harness provides it.

The fallback writes the same kind of line itself: tab-separated, header once, one write per line
under an exclusive lock, so concurrent writers never interleave.
"""

from __future__ import annotations

import fcntl
import json
import os

try:
    from fa4tune import results_tsv as _harness
except ImportError:  # the harness module is not there yet: write rows ourselves
    _harness = None

COLUMNS = ("commit", "kind", "problem_class", "geomean_tflops", "status", "proposer", "study", "trial", "config", "description")


def append_row(path: str, row: dict) -> None:
    """Appends one row (keys: COLUMNS) to the results file."""
    if _harness is not None and hasattr(_harness, "append_row"):
        _harness.append_row(path, row)
        return
    line = "\t".join(_cell(row.get(c, "")) for c in COLUMNS) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if os.fstat(fd).st_size == 0:
            os.write(fd, ("\t".join(COLUMNS) + "\n").encode())
        os.write(fd, line.encode())
    finally:
        os.close(fd)  # closing releases the lock


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"))
    return str(value).replace("\t", " ").replace("\n", " ")
