"""results.tsv: append and parse round trip, concurrent writers, and a writer that dies mid-write."""

import subprocess
import sys
import textwrap

import pytest

from fa4tune.harness import results_tsv
from fa4tune.harness.results_tsv import COLUMNS, ResultRow, append_row, read_rows

ROOT = str(__import__("pathlib").Path(__file__).resolve().parent.parent)


def make_row(**changes):
    row = dict(
        timestamp="2026-11-29T08:00:00+00:00", commit="2fe407c-dirty", proposer="manual", target="sm120",
        device="NVIDIA H200", mode="emulated", fwd_tflops_geomean=301.25, bwd_tflops_geomean=None,
        fwd_tflops_peak=383.5, bwd_tflops_peak=None, peak_vram_mb=1234.0, configs_ok="7/8", status="incorrect",
        prepare_sha256="ab" * 32, description="tabs\there, a newline\nand a backslash \\t, ünïcode",
        config={"forward": {"d128-causal-bf16": {"tile_m": 128, "Q_in_regs": True}}, "note": "a\tb"},
    )
    row.update(changes)
    return ResultRow(**row)


def test_round_trip_keeps_every_value(tmp_path):
    path = tmp_path / "results.tsv"
    first, second = make_row(), make_row(proposer="optuna", fwd_tflops_geomean=0.1, status="ok", description="")
    append_row(path, first)
    append_row(path, second)
    lines = path.read_text().splitlines()
    assert lines[0].split("\t") == list(COLUMNS)
    assert len(lines) == 3 and all(len(line.split("\t")) == len(COLUMNS) for line in lines)
    contents = read_rows(path)
    assert contents.rows == (first, second)
    assert contents.skipped == ()


def test_every_column_of_the_issue_is_there():
    for name in ("timestamp", "commit", "proposer", "target", "device", "mode", "status", "description", "config",
                 "fwd_tflops_geomean", "bwd_tflops_geomean", "peak_vram_mb", "configs_ok", "prepare_sha256"):
        assert name in COLUMNS


def test_a_missing_file_reads_as_empty(tmp_path):
    assert read_rows(tmp_path / "none.tsv").rows == ()


WRITER = textwrap.dedent('''
    import sys
    sys.path.insert(0, {root!r})
    from fa4tune.harness.results_tsv import ResultRow, append_row
    writer = int(sys.argv[1])
    for i in range({rows}):
        # lines far longer than a pipe buffer: only the lock keeps them whole
        append_row({path!r}, ResultRow("t", "c", f"writer{{writer}}", "sm120", "dev", "emulated", float(i), None, None, None,
                                        None, "1/1", "ok", "x", f"{{writer}}:{{i}}:" + "y" * 20000, {{"i": i}}))
''')


def test_concurrent_writers_never_interleave(tmp_path):
    path = tmp_path / "results.tsv"
    rows_each, writers = 15, 4
    script = WRITER.format(root=ROOT, rows=rows_each, path=str(path))
    procs = [subprocess.Popen([sys.executable, "-c", script, str(w)]) for w in range(writers)]
    assert [p.wait(timeout=60) for p in procs] == [0] * writers
    contents = read_rows(path)
    assert contents.skipped == ()
    assert len(contents.rows) == rows_each * writers
    seen = {row.description.split(":")[0] + ":" + row.description.split(":")[1] for row in contents.rows}
    assert seen == {f"{w}:{i}" for w in range(writers) for i in range(rows_each)}
    headers = [line for line in path.read_text().splitlines() if line.startswith("timestamp\t")]
    assert len(headers) == 1 and path.read_text().startswith("timestamp\t")  # one header, however many writers


TORN_WRITER = textwrap.dedent('''
    import fcntl, os, signal, sys
    sys.path.insert(0, {root!r})
    from fa4tune.harness.results_tsv import lock_path
    from pathlib import Path
    line = {line!r}
    lock = os.open(lock_path(Path({path!r})), os.O_RDWR | os.O_CREAT)
    fcntl.flock(lock, fcntl.LOCK_EX)
    fd = os.open({path!r}, os.O_WRONLY | os.O_APPEND)
    os.write(fd, line[: len(line) // 2].encode())
    os.kill(os.getpid(), signal.SIGKILL)  # dies mid-write, holding the lock
''')


def test_a_writer_killed_mid_write_leaves_one_torn_line_that_the_reader_skips(tmp_path):
    path = tmp_path / "results.tsv"
    before = make_row(description="before")
    append_row(path, before)
    script = TORN_WRITER.format(root=ROOT, line=make_row(description="torn").to_line(), path=str(path))
    assert subprocess.run([sys.executable, "-c", script]).returncode == -9
    contents = read_rows(path)
    assert contents.rows == (before,)
    assert contents.torn_final_line
    assert len(contents.skipped) == 1
    # the lock died with the writer; the next append ends the torn line and stays whole itself
    after = make_row(description="after")
    append_row(path, after)
    contents = read_rows(path)
    assert contents.rows == (before, after)
    assert not contents.torn_final_line
    assert len(contents.skipped) == 1 and "malformed" in contents.skipped[0][1]


def test_a_line_with_the_wrong_field_count_is_rejected():
    with pytest.raises(ValueError, match="16 tab-separated fields"):
        ResultRow.from_line("a\tb\n")


def test_lock_file_sits_beside_the_log(tmp_path):
    assert results_tsv.lock_path(tmp_path / "results.tsv").name == "results.tsv.lock"
