"""`python -m search report --plots DIR`: four PNG figures of the studies (matplotlib, Agg).

best_so_far.png      best geomean TFLOPS so far against trial number, every study, points coloured by proposer
speedup.png          per-problem speedup of the confirmed winners over upstream's default, forward and backward
tile_heatmap.png     best TFLOPS per (tile_m, tile_n), one panel per num_threads, for one forward problem class
registers_spills.png registers and spill bytes (sm_120a cubin) against TFLOPS for that class

Numbers come from the studies' trials, or from a recorded table when one is given (the winners stay the
studies'). Every figure says where its numbers come from (search.reviewing.evidence.source_label). A figure is as large as
its panels, with its title wrapped to that width; a panel with nothing to draw is left out (a figure with no
panel left says why in one line).
"""

from __future__ import annotations

import itertools
from pathlib import Path

from fa4tune.static_check import DEFAULT_CACHE, FactsCache
from search.reviewing.evidence import StudyEvidence, source_label
from search.space import get_space
from search.storing.history import config_key

PROPOSER_COLOURS = {
    "baseline": "#000000", "tpe": "#1f77b4", "gp": "#17becf", "random": "#7f7f7f", "claude": "#d62728",
    "scripted": "#9467bd", "explore": "#ff7f0e", "transfer": "#bcbd22", "confirmation": "#2ca02c",
}
OTHER_COLOUR = "#8c564b"
DPI = 110
TITLE_CHARS_PER_INCH = 12  # 10 pt DejaVu Sans averages about 6 pt a character: wrap titles at this many per inch


def make_plots(studies: list[StudyEvidence], out_dir: str | Path, table=None, plot_class: str | None = None,
               needed: int = 2, static_cache: Path | None = DEFAULT_CACHE, table_meta: dict | None = None) -> list[Path]:
    """Writes the four figures into out_dir; their paths. `table_meta` labels replayed numbers when no table is given."""
    import matplotlib

    matplotlib.use("Agg")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    label = _sources(studies, table.meta if table is not None else table_meta)
    fwd = [ev for ev in studies if ev.direction == "fwd"]
    chosen = _plot_class(fwd, plot_class)
    figures = {
        "best_so_far.png": best_so_far(studies, label),
        "speedup.png": speedup(studies, label, table, needed),
        "tile_heatmap.png": tile_heatmap(chosen, label, table),
        "registers_spills.png": registers_spills(chosen, label, table, static_cache),
    }
    import matplotlib.pyplot as plt

    paths = []
    for name, fig in figures.items():
        fig.savefig(out / name, dpi=DPI, bbox_inches="tight", pad_inches=0.15)  # (nothing drawn outside is cut)
        plt.close(fig)
        paths.append(out / name)
    return paths


def _sources(studies: list[StudyEvidence], table_meta: dict | None) -> str:
    labels = sorted({source_label(*ev.source(), table_meta) for ev in studies if ev.source()[0]})
    return "; ".join(labels) or "no measurements"


def _plot_class(fwd: list[StudyEvidence], name: str | None) -> StudyEvidence | None:
    if name:
        found = [ev for ev in fwd if ev.problem_class.name == name]
        if not found:
            from fa4tune.config import ConfigError

            raise ConfigError("plot_class", f"no forward study of problem class {name!r} (have: {', '.join(ev.problem_class.name for ev in fwd) or 'none'})")
        return found[0]
    # the class with the most passing measurements shows the most of the tile grid
    return max(fwd, key=lambda ev: sum(1 for r in ev.search_trials if r.evaluated and r.ok), default=None)


def _figure(rows: int, cols: int, width: float, height: float):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(rows, cols, figsize=(width, height), squeeze=False, constrained_layout=True)
    return fig, axes


def _title(fig, text: str, fontsize: float = 10) -> None:
    """The figure's title, each line wrapped to the figure's width."""
    import textwrap

    width = max(20, int(fig.get_figwidth() * TITLE_CHARS_PER_INCH * 10 / fontsize))
    fig.suptitle("\n".join(textwrap.fill(line, width) for line in text.split("\n")), fontsize=fontsize)


def _message(text: str, label: str):
    """A figure with nothing to plot: one line that says why, and where the numbers would come from."""
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(7, 1), constrained_layout=True)
    _title(fig, f"{text}\n{label}")
    fig.set_figheight(0.3 + 0.2 * (fig.get_suptitle().count("\n") + 1))
    return fig


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def best_so_far(studies: list[StudyEvidence], label: str):
    """Best-so-far against trial number per study; each trial's value as a point in its proposer's colour."""
    from matplotlib.ticker import MaxNLocator

    if not studies:
        return _message("Best geomean TFLOPS so far: no search studies", label)
    cols = min(4, len(studies))
    rows = -(-len(studies) // cols)
    fig, axes = _figure(rows, cols, max(7.0, 4.2 * cols), 3.2 * rows + 1.0)
    seen: list[str] = []
    for ax, ev in zip(axes.flat, studies):
        best, xs, ys = None, [], []
        for r in ev.search_trials:
            colour = PROPOSER_COLOURS.get(r.proposer, OTHER_COLOUR)
            seen += [r.proposer] if r.proposer not in seen else []
            if r.evaluated and r.ok:
                ax.scatter(r.number, r.value, s=16, color=colour, zorder=3)
                best = r.value if best is None else max(best, r.value)
            elif r.status != "ok":
                ax.scatter(r.number, 0, s=14, marker="x", color=colour, zorder=3)
            if best is not None:
                xs.append(r.number)
                ys.append(best)
        ax.step(xs, ys, where="post", color="#444444", linewidth=1.2, zorder=2)
        default = ev.default()
        if default is not None:
            ax.axhline(default.value, color="#999999", linestyle="--", linewidth=1)
        ax.set_title(f"{ev.direction} {ev.problem_class.name}", fontsize=9)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # trial numbers
        ax.set_xlabel("trial", fontsize=8)
        ax.set_ylabel("geomean TFLOPS", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(studies):]:
        ax.remove()  # (the last row's empty cells)
    if seen:
        from matplotlib.lines import Line2D

        handles = [Line2D([], [], marker="o", linestyle="", color=PROPOSER_COLOURS.get(n, OTHER_COLOUR)) for n in seen]
        fig.legend(handles, seen, loc="outside lower center", ncol=len(seen), fontsize=8)
    _title(fig, f"Best geomean TFLOPS so far (line), each trial coloured by proposer (x: infeasible or failed, at 0; "
                f"dashed: upstream default)\n{label}")
    return fig


def _per_problem(ev: StudyEvidence, config: dict, table) -> dict[str, float] | None:
    """{problem: TFLOPS} of a config in this study's class: from the table when given, else from its trial."""
    if table is not None:
        m = table.lookup(ev.direction, ev.problem_class.name, get_space(ev.direction).config(config))
        if m is None or not m.ok:
            return None
        return {r.problem: r.tflops for r in m.results}
    key = config_key(config)
    trial = next((r for r in ev.search_trials if r.evaluated and r.ok and config_key(r.config) == key), None)
    return dict(trial.tflops) if trial else None


def speedup(studies: list[StudyEvidence], label: str, table, needed: int):
    """Per problem: the confirmed winner's TFLOPS over upstream's default, a panel per direction that has one."""
    panels, notes = {}, []
    for direction in ("fwd", "bwd"):
        bars = []
        for ev in (ev for ev in studies if ev.direction == direction):
            w = ev.winner()
            if w is None or len(ev.confirmed(w.number)) < needed:
                notes.append(f"{direction} {ev.problem_class.name}: no winner confirmed {needed} times")
                continue
            tuned, default = _per_problem(ev, w.config, table), _per_problem(ev, ev.default_config(), table)
            if not tuned or not default:
                notes.append(f"{direction} {ev.problem_class.name}: upstream default not measured")
                continue
            for problem, value in tuned.items():
                if problem in default:
                    bars.append((f"{ev.problem_class.name} | {problem}", value / default[problem], default[problem], value))
        if bars:
            panels[direction] = bars
    source = f"numbers from {table.name}" if table is not None else "numbers from the studies' trials"
    left_out = f"\nleft out: {'; '.join(notes)}" if notes else ""
    if not panels:
        what = "no study with a confirmed winner and a measured upstream default" if studies else "no search studies"
        return _message(f"Speedup of the tuned dispatch over upstream defaults: {what}{left_out}", label)
    rows = max(len(bars) for bars in panels.values())
    fig, axes = _figure(1, len(panels), 8 * len(panels), 2.4 + 0.35 * rows)
    for ax, (direction, bars) in zip(axes.flat, panels.items()):
        names = [b[0] for b in bars]
        values = [b[1] for b in bars]
        colours = ["#2ca02c" if v > 1.005 else "#7f7f7f" for v in values]
        ax.barh(range(len(bars)), values, color=colours, height=0.6)
        ax.set_yticks(range(len(bars)), names, fontsize=7)
        ax.set_ylim(rows - 0.5, -0.5)  # top to bottom, bars of one height in every panel
        ax.axvline(1.0, color="#000000", linewidth=1)
        for i, (_, v, base, tuned) in enumerate(bars):
            ax.text(v, i, f" {v:.2f}x ({base:.0f} -> {tuned:.0f})", va="center", fontsize=7)
        ax.set_xlim(min(0.9, min(values) - 0.05), max(values) * 1.3)
        ax.set_xlabel("tuned / upstream default TFLOPS", fontsize=8)
        title = {"fwd": "forward", "bwd": "backward"}[direction]
        ax.set_title(f"{title}: confirmed winner vs upstream's SM120 default, per problem", fontsize=9)
    _title(fig, f"Speedup of the tuned dispatch over upstream defaults ({source}){left_out}\n{label}")
    return fig


def _measurements(ev: StudyEvidence, table) -> list[tuple[dict, float | None]]:
    """(config, geomean TFLOPS or None when it did not pass) of every measured config of the class."""
    if table is not None:
        return [(m.config, m.geomean_tflops()) for m in table.measurements(ev.direction, ev.problem_class.name)]
    return [(r.config, r.value if r.ok else None) for r in ev.search_trials if r.evaluated]


def tile_heatmap(ev: StudyEvidence | None, label: str, table):
    """Best TFLOPS per (tile_m, tile_n) over the other knobs, one panel per num_threads that has a measured config."""
    import numpy as np
    from matplotlib.patches import Rectangle

    if ev is None:
        return _message("Best geomean TFLOPS per tile: no forward study to draw", label)
    space = get_space("fwd")
    tile_m, tile_n = space.domain["tile_m"], space.domain["tile_n"]
    grids = {t: np.full((len(tile_m), len(tile_n)), np.nan) for t in space.domain["num_threads"]}
    measured = {t: np.zeros((len(tile_m), len(tile_n)), bool) for t in space.domain["num_threads"]}
    for config, value in _measurements(ev, table):
        t, i, j = config["num_threads"], tile_m.index(config["tile_m"]), tile_n.index(config["tile_n"])
        measured[t][i, j] = True
        if value is not None and not (grids[t][i, j] >= value):
            grids[t][i, j] = value
    threads = [t for t in grids if measured[t].any()]
    source = f"all configs in {table.name}" if table is not None else "the study's trials"
    if not threads:
        return _message(f"fwd {ev.problem_class.name}: best geomean TFLOPS per tile: no config measured ({source})", label)
    values = [v for g in grids.values() for v in g.flatten() if not np.isnan(v)]
    vmin, vmax = (min(values), max(values)) if values else (0, 1)
    default, w = ev.default_config(), ev.winner()
    # a tile is infeasible when no value of the other knobs (every kernel class with its own knobs) makes it feasible
    rest = [name for name in space.domain if name not in ("tile_m", "tile_n", "num_threads")]
    others = [dict(zip(rest, combo)) for combo in itertools.product(*(space.domain[name] for name in rest))]
    fig, axes = _figure(1, len(threads), max(7.0, 5.2 * len(threads)), 4.9)
    for ax, t in zip(axes.flat, threads):
        image = ax.imshow(grids[t], cmap="viridis", vmin=vmin, vmax=vmax, origin="upper")
        for i, m in enumerate(tile_m):
            for j, n in enumerate(tile_n):
                feasible = any(space.check(space.config({**other, "tile_m": m, "tile_n": n, "num_threads": t}), ev.problem_class, _target(ev))
                               for other in others)
                if not np.isnan(grids[t][i, j]):
                    text, colour = f"{grids[t][i, j]:.0f}", "white" if grids[t][i, j] < (vmin + vmax) / 2 else "black"
                else:
                    text, colour = ("infeasible" if not feasible else "failed" if measured[t][i, j] else "not run"), "#555555"
                ax.text(j, i, text, ha="center", va="center", fontsize=7, color=colour)
        for config, mark in ((default, "default"), (w.config if w else None, "winner")):
            if config and config["num_threads"] == t:
                i, j = tile_m.index(config["tile_m"]), tile_n.index(config["tile_n"])
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red" if mark == "winner" else "white",
                                       linewidth=2.5, linestyle="-" if mark == "winner" else "--"))
        ax.set_xticks(range(len(tile_n)), tile_n)
        ax.set_yticks(range(len(tile_m)), tile_m)
        ax.set_xlabel("tile_n", fontsize=8)
        ax.set_ylabel("tile_m", fontsize=8)
        ax.set_title(f"num_threads={t}", fontsize=9)
        fig.colorbar(image, ax=ax, shrink=0.8, label="geomean TFLOPS")
    unmeasured = [t for t in grids if t not in threads]
    left_out = f"; no config with num_threads={', '.join(map(str, unmeasured))} measured" if unmeasured else ""
    _title(fig, f"fwd {ev.problem_class.name}: best geomean TFLOPS per tile, max over num_stages and Q_in_regs ({source}{left_out})\n"
                f"red box: the study's winner; white dashed box: upstream's default\n{label}")
    return fig


def _target(ev: StudyEvidence):
    from fa4tune.targets import get_target

    return get_target(ev.target or None)


def _static_facts(ev: StudyEvidence, cache_path: Path | None) -> tuple[dict[tuple, dict], str]:
    """{config key: static facts} of the class, from the trials when they carry them, else from the facts cache."""
    facts = {config_key(r.config): r.static for r in ev.search_trials if r.static and r.static.get("registers")}
    if facts:
        return facts, "static facts from the trials"
    if cache_path is None or not Path(cache_path).exists():
        return {}, ""
    space = get_space(ev.direction)
    for entry in FactsCache(Path(cache_path)).entries.values():
        if entry.get("kind") == ev.direction and entry.get("problem_class") == ev.problem_class.name and entry.get("status") == "ok":
            facts[config_key(space.config(entry["config"]).to_dict())] = entry
    return facts, f"static facts from {Path(cache_path).name}" if facts else ""


def registers_spills(ev: StudyEvidence | None, label: str, table, cache_path: Path | None = DEFAULT_CACHE):
    """Registers and spill bytes of the sm_120a cubin against measured TFLOPS, per config of one class (the spill
    panel only when a config spills)."""
    if ev is None:
        return _message("sm_120a registers and spills vs TFLOPS: no forward study to draw", label)
    facts, where = _static_facts(ev, cache_path)
    points = []
    for config, value in _measurements(ev, table):
        f = facts.get(config_key(config))
        if f is not None and value is not None:
            points.append((f["registers"], f.get("spill_store_bytes", 0) + f.get("spill_load_bytes", 0), value, config))
    if not points:
        why = "no static facts for this class" if not facts else "no static facts for a measured config"
        return _message(f"fwd {ev.problem_class.name}: registers/spills vs TFLOPS: {why} (run the static check: "
                        f"`uv run python experiment.py --static` fills {DEFAULT_CACHE.name})", label)
    spills = any(p[1] for p in points)
    panels = [(0, "registers per thread")] + ([(1, "spill store + load bytes (SASS)")] if spills else [])
    fig, axes = _figure(1, len(panels), max(7.0, 6 * len(panels)), 4.6)
    default, w = config_key(ev.default_config()), ev.winner()
    for ax, (index, xlabel) in zip(axes.flat, panels):
        for t, colour in ((128, "#1f77b4"), (256, "#ff7f0e")):
            chosen = [p for p in points if p[3]["num_threads"] == t]
            if chosen:
                ax.scatter([p[index] for p in chosen], [p[2] for p in chosen], s=22, color=colour, label=f"num_threads={t}")
        for p in points:
            if config_key(p[3]) == default:
                ax.scatter(p[index], p[2], s=120, facecolors="none", edgecolors="black", linewidths=1.5, label="upstream default")
            if w is not None and config_key(p[3]) == config_key(w.config):
                ax.scatter(p[index], p[2], s=160, marker="*", color="red", label="winner")
        ax.set_xlabel(xlabel, fontsize=8)
        ax.set_ylabel("geomean TFLOPS", fontsize=8)
        ax.legend(fontsize=7)
        if index == 1:
            ax.set_xscale("symlog", linthresh=100)
    source = f"TFLOPS from {table.name}" if table is not None else "TFLOPS from the study's trials"
    what = "registers and spills" if spills else "registers (no config spills)"
    _title(fig, f"fwd {ev.problem_class.name}: sm_120a {what} vs TFLOPS, {_plural(len(points), 'config')} "
                f"({where}; {source})\n{label}")
    return fig
