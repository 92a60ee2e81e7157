"""The parser every command uses (prepare.py, experiment.py, `python -m fa4tune.guards`, `python -m search`) and its
argument types: a bad argument is one `error:` line and exit code 2, like every refusal. Below the harness and the
commands alike, so that the harness's own command lines import no command module (fa4tune.cli reaches the harness)."""

from __future__ import annotations

import argparse


class CommandParser(argparse.ArgumentParser):
    """argparse's parser, except that a bad argument is one `error:` line and exit code 2, like every refusal."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (usage: {self.prog} --help)\n")


def count(text: str) -> int:
    """argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def positive_seconds(text: str) -> float:
    """argparse type: a number of seconds above 0."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text}")
    return value
