"""The pull request's text for an exported patch (Markdown): what changes, the evidence per study, the caveat; and
`export`, the hand-over that writes both (the patch from search.reviewing.export, then this text about it).
The data flows one way: this module reads export's winners and patch, export never imports this module."""

from __future__ import annotations

from search.reviewing import export as exporter
from search.reviewing import mask_fix
from search.reviewing.export import (Winner, _class_of, _evidence_table, _gate_summary, _knobs, _measured, carried_classes,
                                     caveat)


def _speedup(w: Winner) -> str:
    return f"{w.trial.value / w.default.value:.2f}x" if w.default else "-"


def featured(winners: list[Winner]) -> Winner | None:
    """The measured winner with the largest speedup over upstream's default: the study a screenshot shows."""
    measured = [w for w in winners if not exporter.replayed(w) and w.default]
    return max(measured, key=lambda w: w.trial.value / w.default.value, default=None)


def screenshot_lines(w: Winner, file_name: str) -> list[str]:
    """The section that shows the featured study's dashboard page (file_name beside the .pr.md)."""
    from search.storing import schema

    trial = next((t for t in w.study.trials if t.number == w.trial.number), None)
    device = (trial.user_attrs.get(schema.DEVICE) if trial else None) or "the study's GPU"
    measured = sum(1 for r in w.study.search_trials if r.evaluated)
    return ["", "## The study behind the largest speedup", "",
            f"![optuna-dashboard: study {w.study.name}]({file_name})", "",
            f"optuna-dashboard on `{w.study.name}` ({_speedup(w)} over the previous default): {measured} trials "
            f"measured on {device}, SM120 kernels emulated there; its history (each trial's geomean TFLOPS), the knobs' "
            "importance and the timeline. `python -m search dashboard --storage URL` opens the same page."]


DECODE_ROLES = ("table", "upstream sm120", "torch sdpa")  # bench/gpu_splitkv.py's roles the decode table shows


def decode_table_lines(path) -> list[str]:
    """The split-KV patch's decode section from `bench/gpu_splitkv.py --part timing --out PATH` (one GPU run): per
    problem, the dispatch table's split-KV, upstream's SM120 path and torch SDPA in TFLOPS, and the two ratios.
    ConfigError decode_table for a file that is not such a run."""
    import json
    from pathlib import Path

    from fa4tune.config import ConfigError

    path = Path(path)
    if not path.is_file():
        raise ConfigError("decode_table", f"--decode-table {str(path)!r}: no such file (bench/gpu_splitkv.py --out writes it)")
    problems: dict[str, dict[str, dict]] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            row = {"": str(err)}
        missing = [k for k in ("problem", "role", "status", "tflops", "device", "mode") if k not in row] if isinstance(row, dict) else ["all"]
        if missing:
            raise ConfigError("decode_table", f"{path} line {n} is not a timing row of bench/gpu_splitkv.py --out "
                                              f"(missing {', '.join(missing)})")
        problems.setdefault(row["problem"], {})[row["role"]] = row
    complete = {label: roles for label, roles in problems.items() if all(r in roles for r in DECODE_ROLES)}
    if not complete:
        raise ConfigError("decode_table", f"{path}: no problem has the table's, upstream's and torch SDPA's rows "
                                          f"({', '.join(DECODE_ROLES)})")
    runs = {(r["device"], r["mode"]) for roles in complete.values() for r in roles.values()}
    if len(runs) > 1:
        raise ConfigError("decode_table", f"{path}: rows of {len(runs)} devices or modes; the table is one run's")
    ((device, mode),) = runs

    def cell(row) -> str:
        return f"{row['tflops']:.2f}" if row["status"] == "ok" and row["tflops"] else row["status"]

    def ratio(a, b) -> str:
        ok = all(r["status"] == "ok" and r["tflops"] for r in (a, b))
        return f"{a['tflops'] / b['tflops']:.2f}x" if ok else "-"

    lines = ["", "## Decode: split-KV against upstream's SM120 path and torch SDPA", "",
             f"`bench/gpu_splitkv.py --part timing` on {device}, {mode.removeprefix('mode: ')}; TFLOPS, every candidate "
             "gated and timed interleaved in one run. torch SDPA runs this device's own kernels, not SM120 code: the "
             "reference a serving stack would otherwise call.", "",
             "| problem | split-KV (this patch) | upstream SM120 | torch SDPA | x upstream | x SDPA |",
             "|---|---:|---:|---:|---:|---:|"]
    elsewhere = []
    for label, roles in complete.items():
        table, upstream, sdpa = (roles[r] for r in DECODE_ROLES)
        name = table.get("name", "")  # gpu_splitkv names the table's row "dispatch table: <kernel> <knobs>"
        if name.startswith("dispatch table:") and "splitkv" not in name:  # another class runs it: not this patch's
            elsewhere.append(f"{label} ({table['name'].removeprefix('dispatch table: ')})")
            continue
        lines.append(f"| {label} | {cell(table)} | {cell(upstream)} | {cell(sdpa)} | {ratio(table, upstream)} | "
                     f"{ratio(table, sdpa)} |")
    if elsewhere:
        lines += ["", f"Left out, the table runs another class there: {'; '.join(elsewhere)}."]
    return lines


def _occupancy(w: Winner) -> str:
    """Where the winner ran: at SM120's CTAs per SM (emulated), or at the emulating GPU's own (before that existed)."""
    return "GPU's own, before SM120's was emulated" if exporter._occupancy_note(w) else "SM120's"


def upstream_test_lines() -> list[str]:
    """What upstream's own tests showed, and what is still owed, for the PR text's Testing section."""
    return [
        "- Upstream's own tests (`tests/cute/test_flash_attn.py`, `test_mask_mod.py`) have not run on this b40 series yet. "
        "The b36 version of this series ran 485 hash-sampled cases of their 418,214, pristine and patched in the same run "
        "(SM120 kernels emulated on an H100): no case got worse, 3 went from failed to passed; those 485 cases reach only "
        "3 of the tuned shapes, so they are a smoke test, not coverage.",
    ]


def reproduce_lines(files) -> list[str]:
    """How a maintainer reruns the evidence with upstream's own tooling."""
    added = [path for path, old, _ in files if old is None and path.startswith("tests/")]
    return [
        "", "### Reproduce with upstream's tooling", "",
        "On an SM120 GPU (RTX 5090, RTX PRO 6000) the tuned entries are the defaults:", "",
        "```", *(f"pytest -q {path}" for path in added), "pytest -q tests/cute/test_flash_attn.py -k 'gqa or mha'",
        "python benchmarks/benchmark_attn.py   # before and after the patch", "```", "",
        "On another SM80+ GPU the same SM120 classes run emulated (SM80 mma.sync code with SM120's 99 KB rule; speed is "
        "that GPU's, so compare ratios only):", "",
        "```", "FLASH_ATTENTION_ARCH=sm_120 FLASH_ATTENTION_NUM_SMS=$(nvidia-smi --query-gpu=multiprocessor_count --format=csv,noheader) \\",
        f"  pytest -q {' '.join(added) or 'tests/cute/test_flash_attn.py'}", "```",
    ]


def pr_text(winners: list[Winner], files: list[tuple[str, str | None, str]], message: str, subject: str, needed: int,
            table_meta: dict | None = None, changes: list[str] | None = None,
            screenshot: tuple[Winner, str] | None = None, sections: list[str] | None = None,
            related: list[str] | None = None, search: list[str] | None = None) -> str:
    """The pull request: title, the hardware caveat first, the files and what each changes (`changes`: the lines, in
    place of the one-patch export's), the related pull requests, speedups (ratios only) per study, `sections` (e.g.
    decode_table_lines), the featured study's dashboard (`screenshot`: its winner and the PNG's file name), the gate,
    the tests and how to reproduce them; `search`: the tuner's commands that found the configs (a folded section)."""
    lines = [f"# {subject}", ""]
    gpus = sorted({device for device, mode in (w.study.source() for w in winners) if mode == "emulated" and device})
    if gpus:  # the headline states the emulation; the caveat below adds only what it does not say
        lines += [f"> **Not run on SM120 hardware; SM120 kernels emulated on {' and '.join(gpus)}** (SM80 mma.sync code "
                  "under SM120's 99 KB shared-memory rule). The speedups below are ratios on that GPU; the entries are to "
                  "be confirmed on an RTX 5090 / RTX PRO 6000 before merging.", ""]
    text = caveat(winners, table_meta, emulation=not gpus)
    if text:
        lines += [f"> **Caveat:** {text}", ""]
    if any(exporter.replayed(w) for w in winners):
        lines += [f"> **Replayed, not measured:** the evidence below was {exporter.evidence_source(winners, table_meta)}; "
                  "no GPU measured these configs for this patch. Measure them on an SM120 GPU before relying on it.", ""]
    lines += ["## What changes", ""]
    lines += [f"- {line}" for line in changes or []]
    for path, old, _ in [] if changes else files:
        if path == exporter.CONFIG_PATH:
            lines.append(f"- {exporter.CONFIG_CHANGE}")
        elif path == exporter.UPSTREAM_PATH:
            lines.append(f"- {exporter.INTERFACE_CHANGE}")
        elif path == mask_fix.PATH:
            lines.append(f"- {mask_fix.CHANGE}")
        elif path == mask_fix.TEST_PATH:
            lines.append(f"- {mask_fix.TEST_CHANGE}")
        elif old is None and path.startswith("tests/"):
            lines.append(f"- `{path}` (new): `can_implement` cases anywhere, outputs against `attention_ref` on SM120.")
        elif old is None:
            c = next(c for c in carried_classes(winners) if c.upstream_path == path)
            lines.append(f"- `{path}` (new): `{c.upstream_class}`, SM120 forward with Q/K/V loaded by TMA on mbarriers, "
                         f"selected by `FwdConfig.{c.flag}`.")
    if related:
        lines += ["", "## Related pull requests", "", *(f"- {line}" for line in related)]
    early = [w for w in winners if exporter._occupancy_note(w)]
    lines += ["", "## Evidence", "",
              "Speedup of the exported config over upstream's previous default: the ratio of the geometric means of "
              f"TFLOPS over each class's problems, {exporter.evidence_source(winners, table_meta)}.", ""]
    if early:
        lines += [f"{len(early)} of these {len(winners)} rows (occupancy: \"GPU's own\") were measured before SM120's "
                  "occupancy was emulated: the emulating GPU ran up to 3 CTAs per SM where SM120 runs one, which favours "
                  "configs with more shared memory. Read them as candidates to re-measure, not as SM120 evidence.", ""]
    lines += ["| dir | problem class | speedup | occupancy | class | trial | measured | gate |",
              "|---|---|---:|---|---|---|---|---|"]
    for w in winners:
        origin = f"#{w.trial.number}" + (f" (in place of #{w.replaces.number})" if w.replaces else "")
        lines.append(f"| {w.direction} | {w.study.problem_class.name} | {_speedup(w)} | {_occupancy(w)} | "
                     f"`{_class_of(w)}` | {origin} | {_measured(w, needed)} | passed |")
    fallbacks = [w for w in winners if w.replaces is not None]
    if fallbacks:
        lines += ["", "Studies whose winner this patch cannot carry export their best trial of upstream's kernel instead:", ""]
        lines += [f"- {w.direction} {w.study.problem_class.name}: {w.why}; #{w.trial.number} "
                  f"({w.trial.value / w.replaces.value:.2f}x the winner's speed), {_measured(w, needed)}." for w in fallbacks]
    lines += ["", "Configs:", ""] + [f"- {w.direction} {w.study.problem_class.name}: `{_knobs(w.config)}`" for w in winners]
    lines += ["", "<details><summary>Speedup per problem</summary>", "", "```", *_evidence_table(winners), "```", "", "</details>"]
    lines += sections or []
    if screenshot is not None:
        lines += screenshot_lines(*screenshot)
    lines += ["", "### Correctness", "", " ".join(_gate_summary(winners))]
    if "Not exported:" in message:
        lines += ["", "### Not exported", ""] + [f"- {line.strip()}" for line in
                                                 message.split("Not exported:\n", 1)[1].split("\n\n", 1)[0].splitlines()]
    lines += ["", "### Testing", ""]
    anywhere = {"tests/cute/test_flash_attn_sm120_configs.py": "each entry's config selection, and its fake-tensor "
                "compile for sm_120a (a subprocess)"}
    lines += [f"- `pytest {path}`: its cases without a GPU ({anywhere.get(path, '`can_implement`, the split heuristic')}) "
              "run anywhere; its output cases are skipped without an SM120 GPU (or emulation, below) and have not run "
              "on SM120 hardware." for path, old, _ in files if old is None and path.startswith("tests/")]
    lines += upstream_test_lines() + reproduce_lines(files)
    if search:
        lines += ["", "<details><summary>How the configs were found (the tuner's commands)</summary>", "", "```",
                  *search, "```", "", "</details>"]
    return "\n".join(lines) + "\n"


def chosen(storage, storage_url: str, table: str | None, target: str, needed: int, allow_replay: bool,
           classes: list[str] | None, **select) -> tuple[list, list[str], dict | None]:
    """(the winners search.reviewing.export.select keeps, its notes, the metadata of the table they were replayed
    from: the --table file's, else the one the studies remember); `select`: its other keywords."""
    from search.storing.storage import describe

    table_meta = None
    if table:
        from search.evaluating.table import load_table

        table_meta = load_table(table).meta
    winners, notes = exporter.select(storage, describe(storage_url), target, needed, allow_replay, classes, **select)
    if table_meta is None:
        from search.reviewing.notes import remembered_table

        table_meta = remembered_table(storage, [w.study.name for w in winners])
    return winners, notes, table_meta


def export(storage, storage_url: str, export_argv: list[str], target: str = "sm120", needed: int = 2,
           allow_replay: bool = False, classes: list[str] | None = None, table: str | None = None,
           upstream_only: bool = False, leave_out: list[str] | None = None) -> tuple[str, list[Winner], str]:
    """`python -m search export`'s hand-over: (the patch text, the exported winners, the pull request's text); a
    one-line ConfigError when anything is refused. The patch is search.reviewing.export's, the text this module's."""
    winners, notes, table_meta = chosen(storage, storage_url, table, target, needed, allow_replay, classes,
                                        upstream_only=upstream_only, leave_out=leave_out)
    files = exporter.patch_files(winners, exporter.pristine_sources())
    message = exporter.commit_message(winners, storage_url, export_argv, table_meta, table, needed, notes)
    subject = exporter.SUBJECT + ("; add a TMA-fed SM120 forward" if carried_classes(winners) else "")
    return exporter.format_patch(files, message, subject), winners, pr_text(winners, files, message, subject, needed, table_meta)
