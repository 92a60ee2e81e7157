"""What a run shows while it works: a rich live table on a terminal, one plain line per trial otherwise."""

from __future__ import annotations

import sys

from search.storing.history import TrialRecord, short_config


def trial_line(study: str, r: TrialRecord, best: TrialRecord | None, done: int, n_trials: int) -> str:
    """One line per trial: who proposed what, what came out, the best so far and progress."""
    if r.status == "ok" and r.value is not None:
        outcome = f"ok {r.value:.1f} TFLOPS"
    else:
        outcome = f"{r.status}: {r.reason}" if r.reason else r.status
    tag = ""
    if r.confirmation_of is not None:
        tag = f" (confirms #{r.confirmation_of}: {'confirmed' if r.confirmed else 'not confirmed'})"
    elif r.duplicate_of is not None:
        tag = f" (duplicate of #{r.duplicate_of}, not measured again)"
    best_text = f"best {best.value:.1f} (#{best.number})" if best else "best -"
    return f"[{study}] trial {r.number} {r.proposer}: {short_config(r.config)} -> {outcome}{tag} | {best_text} | {done}/{n_trials}"


class PlainView:
    """For logs (`> run.log`): one line per trial and one per message, nothing else."""

    def __init__(self, out=None):
        self.out = out or sys.stdout

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def turn(self, study: str, proposer: str) -> None:
        pass

    def trial(self, study: str, r: TrialRecord, best: TrialRecord | None, done: int, n_trials: int) -> None:
        print(trial_line(study, r, best, done, n_trials), file=self.out, flush=True)

    def message(self, text: str) -> None:
        print(text, file=self.out, flush=True)


class RichView(PlainView):
    """A live table: per study trials done, best so far and its config; whose turn it is; the last trial."""

    def __init__(self):
        super().__init__()
        self.rows: dict[str, dict] = {}
        self.whose_turn = ""
        self.last = ""
        self._live = None

    def __enter__(self):
        from rich.live import Live

        self._live = Live(self._render(), refresh_per_second=4, transient=False)
        self._live.__enter__()
        return self

    def __exit__(self, *exc):
        self._live.update(self._render())
        return self._live.__exit__(*exc)

    def turn(self, study: str, proposer: str) -> None:
        self.whose_turn = f"{study}: {proposer}'s turn"
        self._refresh()

    def trial(self, study: str, r: TrialRecord, best: TrialRecord | None, done: int, n_trials: int) -> None:
        self.rows[study] = {"done": f"{done}/{n_trials}", "best": best}
        self.last = trial_line(study, r, best, done, n_trials)
        self._refresh()

    def message(self, text: str) -> None:
        self._live.console.print(text, markup=False, highlight=False)

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._render())

    def _render(self):
        from rich.table import Table

        table = Table(title="fa4-tune search", caption=f"{self.whose_turn}\n{self.last}", caption_justify="left")
        for column in ("study", "trials", "best TFLOPS", "best config", "by"):
            table.add_column(column)
        for study, row in self.rows.items():
            best = row["best"]
            table.add_row(
                study, row["done"], f"{best.value:.1f} (#{best.number})" if best else "-",
                short_config(best.config) if best else "", best.proposer if best else "",
            )
        return table


def make_view(out=None) -> PlainView:
    """Rich on a terminal, plain lines otherwise."""
    stream = out or sys.stdout
    return RichView() if stream.isatty() else PlainView(stream)
