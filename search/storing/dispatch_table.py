"""experiment.py's dispatch tables as text: read one entry's knobs, write one entry (one entry per line or wrapped),
so that `search apply` edits the file readably and `search run` knows what the table holds without importing it."""

from __future__ import annotations

import ast
from dataclasses import fields

from fa4tune.config import ConfigError

DISPATCH = {"fwd": "FORWARD_DISPATCH", "bwd": "BACKWARD_DISPATCH"}
MAX_LINE = 120


def render_entry(key: str, config, indent: str = "    ") -> str:
    """A dispatch entry line (wrapped when long): '"d128-causal-bf16": ForwardConfig(tile_m=..., ...),'."""
    defaults = {f.name: f.default for f in fields(config)}
    knobs = [f"{f.name}={_literal(getattr(config, f.name))}" for f in fields(config)
             if not (f.name in ("kernel", "extra") and getattr(config, f.name) == defaults[f.name])]
    cls = type(config).__name__
    line = f'{indent}"{key}": {cls}({", ".join(knobs)}),'
    if len(line) <= MAX_LINE:
        return line
    rows, current = [], ""
    for knob in knobs:
        candidate = f"{current}, {knob}" if current else knob
        if len(indent) * 2 + len(candidate) + 1 > MAX_LINE:
            rows.append(current + ",")
            current = knob
        else:
            current = candidate
    rows.append(current + ",")
    return "\n".join([f'{indent}"{key}": {cls}(', *(f"{indent * 2}{r}" for r in rows), f"{indent}),"])


def _literal(value) -> str:
    if isinstance(value, tuple) and all(isinstance(pair, tuple) for pair in value):  # ForwardConfig.extra, as a dict
        return "{" + ", ".join(f"{_literal(name)}: {_literal(v)}" for name, v in value) + "}"
    return f'"{value}"' if isinstance(value, str) else repr(value)  # the file's quotes


def edit_dispatch(source: str, direction: str, key: str, config) -> str:
    """The source with the dispatch entry for `key` replaced (or added before the closing brace)."""
    table = _dispatch_node(source, DISPATCH[direction])
    lines = source.splitlines(keepends=True)
    entry = render_entry(key, config) + "\n"
    for k, v in zip(table.keys, table.values):
        if isinstance(k, ast.Constant) and k.value == key:
            first, last = k.lineno - 1, v.end_lineno - 1
            before, after = lines[first][: k.col_offset], lines[last][v.end_col_offset:]
            if before.strip() or after.strip() not in (",", ""):
                raise ConfigError("dispatch_format", f"{DISPATCH[direction]}[{key!r}] does not sit on lines of its own; edit it by hand")
            return "".join(lines[:first] + [entry] + lines[last + 1:])
    closing = table.end_lineno - 1
    if lines[closing].strip() != "}":
        raise ConfigError("dispatch_format", f"{DISPATCH[direction]} does not end with a '}}' line; edit it by hand")
    return "".join(lines[:closing] + [entry] + lines[closing:])


def _dispatch_node(source: str, name: str) -> ast.Dict:
    for node in ast.parse(source).body:
        target = node.target if isinstance(node, ast.AnnAssign) else (node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id == name and isinstance(node.value, ast.Dict):
            return node.value
    raise ConfigError("dispatch_format", f"experiment.py has no {name} = {{...}} dict")


def effective_entry_config(source: str, direction: str, problem_class) -> dict | None:
    """The knob values of the entry that dispatch runs for a ProblemClass: its own, else its fallback class's
    (ProblemClass.fallback: a chunked class's prefill class), as experiment.forward_config / backward_config choose;
    None where upstream's default runs."""
    written = entry_config(source, direction, problem_class.name)
    fallback = problem_class.fallback
    if written is None and fallback is not None:
        written = entry_config(source, direction, fallback.name)
    return written


def entry_config(source: str, direction: str, key: str) -> dict | None:
    """The knob values written in a dispatch entry, read back from the source (None if absent or not a literal
    ForwardConfig(...) / BackwardConfig(...), e.g. `defaults.upstream_backward(...)`)."""
    table = _dispatch_node(source, DISPATCH[direction])
    for k, v in zip(table.keys, table.values):
        if (isinstance(k, ast.Constant) and k.value == key and isinstance(v, ast.Call) and isinstance(v.func, ast.Name)
                and v.func.id in ("ForwardConfig", "BackwardConfig")):
            try:
                knobs = {kw.arg: ast.literal_eval(kw.value) for kw in v.keywords}
            except ValueError:
                return None
            extra = knobs.pop("extra", {})  # a kernel class's own knobs: flat, as in ForwardConfig.to_dict()
            return {**knobs, **extra}
    return None
