"""experiment.py's dispatch tables as text: read one entry's knobs, write one entry (one entry per line or wrapped),
so that `search apply` edits the file readably and `search run` knows what the table holds without importing it."""

from __future__ import annotations

import ast
from dataclasses import fields

from fa4tune import fallback
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
    """The source with the dispatch entry for `key` replaced (or added before the closing brace). A comment after
    the entry on its last line goes with it: it spoke of the config replaced."""
    table = _dispatch_node(source, DISPATCH[direction])
    lines = source.splitlines(keepends=True)
    entry = render_entry(key, config) + "\n"
    for k, v in zip(table.keys, table.values):
        if isinstance(k, ast.Constant) and k.value == key:
            first, last = k.lineno - 1, v.end_lineno - 1
            before, after = lines[first][: k.col_offset], lines[last][v.end_col_offset:]
            if before.strip() or after.split("#", 1)[0].strip() not in (",", ""):
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


def effective_entry_config(source: str, direction: str, problem_class, feasible=None) -> dict | None:
    """The knob values of the entry that dispatch runs for a ProblemClass under fa4tune.fallback's rule (its own, else
    its nearest tuned class's where feasible for it, else ours for wide heads where upstream's default does not fit),
    as experiment.forward_config / backward_config choose; None where upstream's default runs (or nothing does).
    `feasible(knobs, problem_class)`: default, the static rules of the sm120 target (the forward's for the class's
    shortest problem, as any entry)."""
    from fa4tune import defaults

    table = {key: knobs for key, knobs in entries(source, direction).items() if knobs is not None}
    steps = tuple((rule, config.to_dict()) for rule, config in defaults.fallback_configs(direction, problem_class))
    return fallback.resolve(problem_class, table, feasible or _static_rules(direction), steps).config


def _static_rules(direction: str):
    from fa4tune.config import BackwardConfig, ForwardConfig
    from fa4tune.feasibility import check_backward, check_forward_entry
    from fa4tune.targets import get_target

    target = get_target()

    def feasible(knobs: dict, pc) -> bool:
        try:
            if direction == "fwd":
                return bool(check_forward_entry(ForwardConfig.from_dict(knobs), pc, target))
            return bool(check_backward(BackwardConfig.from_dict(knobs), pc, target))
        except (ConfigError, TypeError):
            return False
    return feasible


def entry_config(source: str, direction: str, key: str) -> dict | None:
    """The knob values written in a dispatch entry, read back from the source (None if absent or not a literal
    config: ForwardConfig(...) / BackwardConfig(...) with literal knobs, a module-level name bound to one (DECODE),
    or `replace(<one of those>, knob=literal, ...)`, a knob's literal also through a module-level name bound to it;
    not e.g. `defaults.upstream_backward(...)`)."""
    return entries(source, direction).get(key)


def entries(source: str, direction: str) -> dict[str, dict | None]:
    """Every literal key of a dispatch table, in the order written, with its knob values (entry_config's reading;
    None for an entry that is not a literal config), the source parsed once."""
    tree = ast.parse(source)
    table = _dispatch_node(source, DISPATCH[direction])
    names = {node.targets[0].id: node.value for node in tree.body if isinstance(node, ast.Assign)
             and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)}
    names.update({node.target.id: node.value for node in tree.body if isinstance(node, ast.AnnAssign)
                  and isinstance(node.target, ast.Name) and node.value is not None})
    found = {}
    for k, v in zip(table.keys, table.values):
        if isinstance(k, ast.Constant) and isinstance(k.value, str) and k.value not in found:
            knobs = _knobs(v, names, depth=0)
            if knobs is not None:
                extra = knobs.pop("extra", {})  # a kernel class's own knobs: flat, as in ForwardConfig.to_dict()
                knobs = {**knobs, **extra}
            found[k.value] = knobs
    return found


def _knobs(node, names: dict, depth: int) -> dict | None:
    """The keywords of a literal config expression (see entry_config), or None."""
    if depth > 8:
        return None
    if isinstance(node, ast.Name):
        return _knobs(names[node.id], names, depth + 1) if node.id in names else None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        return None
    try:
        keywords = {kw.arg: _literal_value(kw.value, names) for kw in node.keywords}
    except ValueError:
        return None
    if None in keywords:  # **kwargs
        return None
    if node.func.id in ("ForwardConfig", "BackwardConfig") and not node.args:
        return keywords
    if node.func.id == "replace" and len(node.args) == 1:
        base = _knobs(node.args[0], names, depth + 1)
        return None if base is None else {**base, **keywords}
    return None


def _literal_value(node, names: dict):
    """A keyword's literal value, or that of a module-level name bound to a literal (`kernel=KREGS` where
    `KREGS = "sm120_cmask_kregs"`); ValueError otherwise."""
    if isinstance(node, ast.Name) and node.id in names:
        node = names[node.id]
    return ast.literal_eval(node)
