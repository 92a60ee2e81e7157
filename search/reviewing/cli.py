"""Command line of the review and hand-off commands: `dashboard`, `report --plots DIR`, `export`.

search/__main__.py registers these; bad input is a ConfigError there (one line on stderr, exit code 2).
Without an optional package (search.optional) the run's notes and the report's plots are skipped with one
line; the dashboard, which is nothing but optuna-dashboard, refuses with one line and exit code 2.
"""

from __future__ import annotations

from pathlib import Path

from fa4tune.config import ConfigError
from search import optional


def add_parsers(sub) -> None:
    """The `dashboard` and `export` subcommands."""
    from search.reviewing.dashboard import DEFAULT_HOST, DEFAULT_PORT

    p = sub.add_parser("dashboard", help="optuna-dashboard on the storage, with notes per study and trial")
    p.add_argument("--storage", default=None, help="Optuna storage URL (default sqlite:///search.db)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 picks a free one)")
    p.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST}; anything else warns)")
    p.add_argument("--table", default=None, help="the table the studies were replayed from, for their notes' device and mode")
    p = sub.add_parser("export", help="confirmed winners -> a git format-patch for upstream flash-attention")
    p.add_argument("--storage", action="append", default=None,
                   help="Optuna storage URL (default sqlite:///search.db); repeatable: the studies of several storages, a "
                        "later storage's study replacing an earlier's of the same name (the reproduce lines name the first)")
    p.add_argument("--out", default="sm120-tuned.patch", help="patch file to write (default sm120-tuned.patch)")
    p.add_argument("--dry-run", action="store_true", help="print the patch, write nothing")
    p.add_argument("--series", default=None, metavar="DIR",
                   help="write a series instead of one patch: DIR/NNNN-*.patch + .pr.md (configs, split-KV decode, TMA)")
    p.add_argument("--screenshots", action="store_true",
                   help="with --series: each PR text shows its featured study's optuna-dashboard page, "
                        "DIR/NNNN-*.dashboard.png (headless Chromium; measured studies only)")
    p.add_argument("--decode-table", default=None, metavar="JSONL",
                   help="with --series: the split-KV patch's PR text shows this decode run against upstream and torch "
                        "SDPA (bench/gpu_splitkv.py --part timing --out JSONL)")
    p.add_argument("--confirmations", type=int, default=2, help="confirmations a winner needs (default 2)")
    p.add_argument("--target", default="sm120", help="export the studies of this target (default sm120)")
    p.add_argument("--problem-class", action="append", dest="problem_classes", help="export only this class (repeatable)")
    p.add_argument("--allow-replay", action="store_true", help="also export winners replayed from a table")
    p.add_argument("--table", default=None, help="the replayed table, for its device and mode in the commit message")
    p.add_argument("--upstream-kernels-only", action="store_true",
                   help="export each study's best trial of upstream's own kernel (no new kernel file), confirmed or not")
    p.add_argument("--leave-out", action="append", default=None, metavar="DIRECTION:CLASS",
                   help="leave this study out, e.g. bwd:d128-causal-gqa4-bf16 (repeatable)")


def add_report_options(p) -> None:
    """`report --plots DIR [--table PATH] [--plot-class NAME]`."""
    p.add_argument("--plots", default=None, metavar="DIR", help="also write PNG figures into DIR")
    p.add_argument("--table", default=None, help="take the figures' numbers from this recorded table")
    p.add_argument("--plot-class", default=None, help="forward problem class of the heat map and the registers plot")
    p.add_argument("--confirmations", type=int, default=2, help="confirmations a winner needs to be plotted (default 2)")
    p.add_argument("--force", action="store_true", help="let --plots replace figures committed to git (e.g. docs/img)")


FIGURES = ("best_so_far.png", "speedup.png", "tile_heatmap.png", "registers_spills.png")  # what --plots writes


def check_plots(args) -> None:
    """Before anything is read: `--plots DIR` does not replace a figure committed to git (docs/img holds the README's)
    unless --force; a one-line ConfigError that names them. Untracked files in DIR are replaced as before."""
    if not getattr(args, "plots", None) or getattr(args, "force", False):
        return
    import subprocess

    out = Path(args.plots)
    existing = [out / name for name in FIGURES if (out / name).is_file()]
    if not existing:
        return
    try:
        tracked = subprocess.run(["git", "ls-files", "--", *(p.name for p in existing)], cwd=out, capture_output=True,
                                 text=True, timeout=10).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return  # not in git: nothing committed to protect
    if tracked:
        raise ConfigError("plots_committed", f"--plots {args.plots}: {', '.join(tracked)} {'is' if len(tracked) == 1 else 'are'} "
                                             "committed to git; write the figures into another folder, or pass --force to replace them")


def plots(args, storage) -> None:
    """Writes the figures when `--plots` was given; one 'skipped:' line without matplotlib."""
    if not getattr(args, "plots", None):
        return
    missing = optional.why_missing("matplotlib")
    if missing:
        print(optional.skipped(f"the plots for {args.plots}", missing), flush=True)
        return
    from search.reviewing.evidence import load_studies
    from search.reviewing.notes import remembered_table
    from search.reviewing.plots import DEFAULT_CACHE, make_plots

    table = None
    if args.table:
        from search.evaluating.table import load_table

        table = load_table(args.table)
    studies = load_studies(storage)
    remembered = remembered_table(storage, [ev.name for ev in studies])
    for path in make_plots(studies, args.plots, table, args.plot_class, args.confirmations, DEFAULT_CACHE, remembered):
        print(f"wrote {path}")


def dashboard(args) -> int:
    """`python -m search dashboard`."""
    from search.reviewing.dashboard import serve
    from search.storing.storage import DEFAULT_STORAGE

    if not 0 <= args.port <= 65535:
        raise ConfigError("port", f"--port must be 0..65535, got {args.port}")
    return serve(args.storage or DEFAULT_STORAGE, args.host, args.port, _table_meta(args.table))


def export(args) -> int:
    """`python -m search export`: the patch on stdout (--dry-run) or in --out."""
    from search.reviewing import export as exporter, pull_request
    from search.storing.storage import DEFAULT_STORAGE

    if args.screenshots and args.series is None:
        raise ConfigError("export_screenshots", "--screenshots goes with --series (the series' PR texts show them)")
    if args.decode_table and args.series is None:
        raise ConfigError("export_decode_table", "--decode-table goes with --series (its split-KV patch's PR text shows it)")
    urls = args.storage or [DEFAULT_STORAGE]
    storage, url = open_storages(urls), urls[0]
    if args.series is not None:
        return export_series(args, storage, url)
    out = Path(args.out)
    if not args.dry_run and not out.parent.is_dir():
        raise ConfigError("export_out", f"cannot write {args.out!r}: directory {str(out.parent)!r} does not exist")
    text, winners, pr = pull_request.export(storage, url, _export_command(args), args.target,
                                            args.confirmations, args.allow_replay, args.problem_classes, args.table,
                                            args.upstream_kernels_only, args.leave_out)
    if args.dry_run:
        print(text, end="")
        return 0
    out.write_text(text)
    pr_path = pr_text_path(out)
    pr_path.write_text(pr)
    changed = sum(w.changed for w in winners)
    carried = exporter.carried_classes(winners)
    fallbacks = sum(w.replaces is not None for w in winners)
    print(f"wrote {args.out}: {len(winners)} winners, {changed} of them change upstream's defaults"
          + (f", carrying {', '.join(c.upstream_path for c in carried)}" if carried else "")
          + (f", {fallbacks} replaced by their best upstream-kernel trial" if fallbacks else "")
          + f" (git apply --check {args.out} in a flash-attention checkout)")
    print(f"wrote {pr_path}: the pull request's text")
    return 0


def export_series(args, storage, url: str) -> int:
    """`python -m search export --series DIR`: NNNN-*.patch and NNNN-*.pr.md per patch (search.reviewing.series)."""
    from search.reviewing.series import export_series as make_series

    folder = Path(args.series)
    if not args.dry_run and not folder.is_dir():
        raise ConfigError("export_series", f"--series {args.series!r}: the directory does not exist")
    if args.upstream_kernels_only:
        raise ConfigError("export_series", "--series with --upstream-kernels-only: the series' patch 1 already keeps to "
                                           "upstream's kernels; leave the flag out")
    shoot = None
    if args.screenshots and not args.dry_run:
        from search.reviewing.screenshot import browser, study_screenshot

        browser()  # no Chromium: refused before anything is read or written

        def shoot(stem: str, study_name: str) -> str:
            return study_screenshot(storage, study_name, folder / f"{stem}.dashboard.png").name
    patches = make_series(storage, url, _export_command(args), args.target, args.confirmations,
                          args.allow_replay, args.problem_classes, args.table, args.leave_out, shoot, args.decode_table)
    for p in patches:
        if args.dry_run:
            print(p.patch, end="")
            continue
        (folder / f"{p.stem}.patch").write_text(p.patch)
        (folder / f"{p.stem}.pr.md").write_text(p.pr)
        print(f"wrote {folder / p.stem}.patch and .pr.md: {len(p.winners)} winners, {', '.join(path for path, *_ in p.files)}")
    from search.reviewing.series import not_written

    for line in not_written(patches):
        print(f"not written: {line}")
    return 0


def pr_text_path(out: Path) -> Path:
    """The pull request's text beside the patch: sm120-tuned.patch -> sm120-tuned.pr.md."""
    return out.with_name(out.name.removesuffix(".patch") + ".pr.md")


def open_storages(urls: list[str]):
    """One existing storage, or several read into one in memory: a later storage's study replaces an earlier's of the
    same name (a study re-run elsewhere), as the export's evidence."""
    from search.storing.storage import open_existing_storage

    if len(urls) == 1:
        return open_existing_storage(urls[0])
    import optuna

    merged = optuna.storages.InMemoryStorage()
    for url in urls:
        source = open_existing_storage(url)
        for summary in source.get_all_studies():
            if summary.study_name in {s.study_name for s in merged.get_all_studies()}:
                optuna.delete_study(study_name=summary.study_name, storage=merged)
            optuna.copy_study(from_study_name=summary.study_name, from_storage=source, to_storage=merged)
    return merged


def _export_command(args) -> list[str]:
    """This export as one command line, every option spelled out."""
    from search.storing.storage import DEFAULT_STORAGE

    argv = ["uv", "run", "python", "-m", "search", "export", *[a for url in args.storage or [DEFAULT_STORAGE] for a in ("--storage", url)],
            *(["--series", args.series] if getattr(args, "series", None) is not None else ["--out", args.out]),
            "--target", args.target, "--confirmations", str(args.confirmations)]
    for name in args.problem_classes or []:
        argv += ["--problem-class", name]
    argv += ["--allow-replay"] if args.allow_replay else []
    argv += ["--table", args.table] if args.table else []
    argv += ["--upstream-kernels-only"] if args.upstream_kernels_only else []
    argv += ["--screenshots"] if getattr(args, "screenshots", False) else []
    argv += ["--decode-table", args.decode_table] if getattr(args, "decode_table", None) else []
    for name in args.leave_out or []:
        argv += ["--leave-out", name]
    return argv


def _table_meta(path: str | None) -> dict | None:
    if not path:
        return None
    from search.evaluating.table import load_table
    from search.reviewing.notes import table_meta

    return table_meta(load_table(path))


def after_run(config) -> None:
    """At the end of `search run`: the study notes (trial notes are written when the dashboard starts);
    one 'skipped:' line without optuna-dashboard, whose note layout they are written in."""
    missing = optional.why_missing("optuna_dashboard")
    if missing:
        print(optional.skipped("study notes for optuna-dashboard", missing), flush=True)
        return
    from search.reviewing.notes import write_notes
    from search.storing.storage import open_storage

    table = _table_meta(config.table) if config.evaluator == "replay" else None
    write_notes(open_storage(config.storage), trials=False, table=table)
