"""The compile workers' process: a JSON line per request, its own session (a terminal's Ctrl-C does not
reach a compile under way), and it ends when its stdin closes. The echo worker writes chatter and its answer
in one flush, as a compiler that prints to a block-buffered stdout does: reading with select() and a buffered
readline() left such an answer in the read buffer until the compile timed out."""

from __future__ import annotations

import os
import time
from pathlib import Path

from fa4tune.line_process import LineProcess

TESTS = str(Path(__file__).resolve().parent)


def _reply(proc: LineProcess, timeout_s: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while (answer := proc.reply()) is None:
        assert time.monotonic() < deadline and proc.alive()
        time.sleep(0.01)
    return answer


def test_a_request_gets_its_answer_past_the_chatter_and_the_process_is_in_its_own_session():
    proc = LineProcess("echo_worker", [], {}, "ECHO ", cwd=TESTS)
    try:
        assert _reply_after(proc, {"job": 1}) == {"job": 1}
        assert _reply_after(proc, {"job": 2, "config": {"tile_m": 128}}) == {"job": 2, "config": {"tile_m": 128}}
        assert os.getsid(proc.proc.pid) != os.getsid(0)  # a Ctrl-C sent to the terminal's process group misses it
    finally:
        proc.stop()
    assert not proc.alive() and proc.returncode == 0  # closing stdin ended it


def test_stop_with_kill_ends_it_at_once():
    proc = LineProcess("echo_worker", [], {}, "ECHO ", cwd=TESTS)
    proc.stop(kill=True)
    assert not proc.alive() and proc.returncode != 0


def _reply_after(proc: LineProcess, request: dict) -> dict:
    proc.send(request)
    return _reply(proc)
