"""results.tsv: the append-only log of every harness run, one tab-separated line per run.

A person reads it with `column -t -s $'\\t' results.tsv`; programs read it with `read_rows`. Appends hold an
exclusive `flock` on a sidecar lock file and write the whole line with one `os.write`, then fsync, so
concurrent writers never interleave. A writer that dies mid-write leaves at most one torn final line
(no trailing newline); the next append first ends that line, and the reader reports it and skips it.
Tabs, newlines and backslashes inside a value are escaped (\\t, \\n, \\\\), so every value round-trips.
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

COLUMNS = (
    "timestamp", "commit", "proposer", "target", "device", "mode",
    "fwd_tflops_geomean", "bwd_tflops_geomean", "fwd_tflops_peak", "bwd_tflops_peak",
    "peak_vram_mb", "configs_ok", "status", "prepare_sha256", "description", "config",
)
HEADER = "\t".join(COLUMNS) + "\n"
_FLOAT_COLUMNS = {"fwd_tflops_geomean", "bwd_tflops_geomean", "fwd_tflops_peak", "bwd_tflops_peak", "peak_vram_mb"}


@dataclass(frozen=True)
class ResultRow:
    """One run of the harness; field names are the column names (config is a JSON-ready dict)."""

    timestamp: str
    commit: str
    proposer: str
    target: str
    device: str
    mode: str
    fwd_tflops_geomean: float | None
    bwd_tflops_geomean: float | None
    fwd_tflops_peak: float | None
    bwd_tflops_peak: float | None
    peak_vram_mb: float | None
    configs_ok: str  # "N/M"
    status: str
    prepare_sha256: str
    description: str = ""
    config: dict = field(default_factory=dict)

    def to_line(self) -> str:
        """The row as one escaped, tab-separated line ending in a newline."""
        values = []
        for name in COLUMNS:
            value = getattr(self, name)
            if name == "config":
                text = json.dumps(value, sort_keys=True, separators=(",", ":"))
            elif name in _FLOAT_COLUMNS:
                text = "" if value is None else repr(float(value))
            else:
                text = str(value)
            values.append(_escape(text))
        return "\t".join(values) + "\n"

    @classmethod
    def from_line(cls, line: str) -> "ResultRow":
        """Inverse of to_line; ValueError for a line that is not a whole row."""
        parts = line.rstrip("\n").split("\t")
        if len(parts) != len(COLUMNS):
            raise ValueError(f"expected {len(COLUMNS)} tab-separated fields, found {len(parts)}")
        data = {}
        for name, raw in zip(COLUMNS, parts):
            text = _unescape(raw)
            if name == "config":
                data[name] = json.loads(text) if text else {}
            elif name in _FLOAT_COLUMNS:
                data[name] = float(text) if text else None
            else:
                data[name] = text
        return cls(**data)

    def to_dict(self) -> dict:
        return asdict(self)


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def _unescape(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            out.append({"t": "\t", "n": "\n", "r": "\r", "\\": "\\"}.get(text[i + 1], text[i + 1]))
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def lock_path(path: Path) -> Path:
    """The sidecar file appends lock (results.tsv -> results.tsv.lock)."""
    return path.with_name(path.name + ".lock")


def append_row(path: str | Path, row: ResultRow) -> None:
    """Append one row (header first if the file is new), atomically with respect to other writers."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock_fd = os.open(lock_path(path), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            data = row.to_line()
            size = os.fstat(fd).st_size
            if size == 0:
                data = HEADER + data
            else:
                os.lseek(fd, size - 1, os.SEEK_SET)
                if os.read(fd, 1) != b"\n":
                    data = "\n" + data  # end a line torn by a writer that died, so this row stays whole
            encoded = data.encode()
            written = os.write(fd, encoded)
            if written != len(encoded):
                raise OSError(f"short write to {path}: {written} of {len(encoded)} bytes")
            os.fsync(fd)
        finally:
            os.close(fd)
    finally:
        fcntl.flock(lock_fd, fcntl.LOCK_UN)
        os.close(lock_fd)


@dataclass(frozen=True)
class TsvContents:
    """What read_rows found: the whole rows, and the lines it skipped with the reason."""

    rows: tuple[ResultRow, ...]
    skipped: tuple[tuple[int, str], ...] = ()  # (1-based line number, reason)

    @property
    def torn_final_line(self) -> bool:
        return any("torn" in reason for _, reason in self.skipped)


def read_rows(path: str | Path) -> TsvContents:
    """Every whole row of a results.tsv; a torn final line or a malformed line is skipped and reported."""
    path = Path(path)
    if not path.exists():
        return TsvContents(())
    text = path.read_bytes().decode(errors="replace")
    lines = text.split("\n")
    complete, last = lines[:-1], lines[-1]  # `last` is "" when the file ends with a newline
    rows, skipped = [], []
    for number, line in enumerate(complete, start=1):
        if number == 1 and line + "\n" == HEADER:
            continue
        if not line:
            continue
        try:
            rows.append(ResultRow.from_line(line))
        except (ValueError, TypeError) as err:
            skipped.append((number, f"malformed line: {err}"))
    if last:
        skipped.append((len(complete) + 1, "torn final line (no newline: a writer stopped mid-write)"))
    return TsvContents(tuple(rows), tuple(skipped))

