"""The storage schema (search.storing.schema): every attribute search/ writes on a study or trial is declared there,
every writer and reader names it through that module, and an evaluated trial stores its whole Measurement as one
attribute, while storages written before that attribute existed still read the same."""

from __future__ import annotations

import ast
import os
import shutil
from dataclasses import replace
from pathlib import Path

import optuna
import pytest

from fa4tune.harness.measurement import Measurement
from search import optional
from search.evaluating.replay import ReplayEvaluator
from search.evaluating.table import load_table
from search.proposing.scripted import ScriptedProposer
from search.proposing.turns import FixedRatio
from search.running.launch import prepare_studies
from search.running.loop import LoopSettings, StopFlag, StudyLoop
from search.running.run_config import RunConfig
from search.running.worker import spec_of
from search.storing import schema
from search.storing.history import record, records
from search.storing.storage import open_storage
from search_helpers import CLASS, ROOT, SUITE, Recorder, make_loop, run_cli, write_table

STUDY = f"fwd:{CLASS}:sm120"
LEGACY_STORAGE = ROOT / "docs" / "measurements" / "logs" / "2026-11-30-h200-study-slots8.db"  # written before `measurement`


# ------------------------------------------------------------------------------------------------
# Every attribute a run writes is declared.
# ------------------------------------------------------------------------------------------------


def _run_every_kind_of_trial(tmp_path) -> tuple[object, optuna.Study]:
    """A replayed study with settings recorded by `run --workers 0`, a trial a killed run left RUNNING (requeued), a
    proposer turn with a rejected (infeasible) proposal, a duplicate, infeasible samples and the winner's confirmation."""
    url, table = f"sqlite:///{tmp_path / 'search.db'}", write_table(tmp_path)
    prepare_studies(RunConfig(storage=url, suite=SUITE, directions=["fwd"], problem_classes=[CLASS], evaluator="replay",
                              table=str(table), proposer="none", n_trials=8, confirmations=1, results=""), open(os.devnull, "w"))
    storage = open_storage(url)
    study = optuna.load_study(study_name=STUDY, storage=storage, sampler=optuna.samplers.RandomSampler(seed=0))
    spec = spec_of(study, SUITE)
    study.ask()  # the baseline, left RUNNING as by a killed run: the next run closes it and queues it again
    study.enqueue_trial(spec.space.params(spec.space.upstream(spec.problem_class)))  # measured first: the requeued baseline copies it
    script = [dict(spec.space.upstream(spec.problem_class).to_dict(), tile_m=256, tile_n=256, num_stages=2),  # breaks the smem rule
              *(m.config for m in load_table(str(table)).measurements("fwd", CLASS)[:3])]
    loop = StudyLoop(study, spec, ReplayEvaluator(load_table(str(table))), "random", [ScriptedProposer(script)],
                     FixedRatio({"random": 1.0, "scripted": 1.0}), LoopSettings(n_trials=8, confirmations=1, results_path=None),
                     Recorder(), StopFlag())
    loop.run()
    return storage, study


def test_every_attribute_a_run_writes_on_a_study_or_trial_is_declared_in_the_schema(tmp_path):
    storage, study = _run_every_kind_of_trial(tmp_path)
    study_keys = set(study.user_attrs)
    trial_keys = {key for t in study.get_trials() for key in t.user_attrs}
    assert study_keys <= set(schema.STUDY_ATTRS), f"undeclared study attributes: {study_keys - set(schema.STUDY_ATTRS)}"
    assert trial_keys <= set(schema.TRIAL_ATTRS), f"undeclared trial attributes: {trial_keys - set(schema.TRIAL_ATTRS)}"
    # the run reached every kind of trial, so the check above covered their writers
    assert {schema.SEARCH_SETTINGS, schema.PROBLEM_SPECS, schema.PENDING_TURNS, schema.REJECTED_PROPOSALS} <= study_keys
    assert {schema.MEASUREMENT, schema.WORKER, schema.RULE, schema.RATIONALE, schema.REQUEUED_FROM, schema.DUPLICATE_OF,
            schema.CONFIRMATION_OF, schema.CONFIRMED} <= trial_keys
    assert not set(schema.LEGACY_TRIAL_ATTRS) & trial_keys  # the measurement holds them now
    if optional.why_missing("optuna_dashboard") is None:
        from search.reviewing.notes import table_meta, write_notes

        write_notes(storage, table=table_meta(load_table(str(tmp_path / "synthetic_table.json"))))
        system = set(storage.get_study_system_attrs(storage.get_study_id_from_name(STUDY)))
        # optuna-dashboard names its notes itself, and Optuna its own attributes (`study:metric_names`)
        ours = {key for key in system if not key.startswith(("dashboard:", "study:"))}
        assert ours == set(schema.STUDY_SYSTEM_ATTRS)


def test_every_name_the_schema_defines_is_in_one_of_its_lists():
    names = {value for name, value in vars(schema).items() if name.isupper() and isinstance(value, str)}
    listed = {*schema.STUDY_ATTRS, *schema.TRIAL_ATTRS, *schema.LEGACY_TRIAL_ATTRS, *schema.STUDY_SYSTEM_ATTRS,
              schema.FIXED_PARAMS, schema.CONSTRAINT_KEY}
    assert names == listed


# ------------------------------------------------------------------------------------------------
# Every writer and reader in search/ names an attribute through the schema module.
# ------------------------------------------------------------------------------------------------

WRITERS = {"set_user_attr": 0, "set_system_attr": 0, "set_study_user_attr": 1, "set_study_system_attr": 1,
           "set_trial_user_attr": 1, "set_trial_system_attr": 1}
ATTR_HOLDERS = ("user_attrs", "system_attrs", "get_study_system_attrs", "get_study_user_attrs")


def _holds_attrs(node: ast.AST, aliases: set[str]) -> bool:
    """Whether an expression is a study's or trial's attributes (`x.user_attrs`, `storage.get_study_system_attrs(i)`,
    `ev.user_attrs(n)`) or a local name bound to one."""
    if isinstance(node, ast.Call):
        node = node.func
    return (isinstance(node, ast.Attribute) and node.attr in ATTR_HOLDERS) or (isinstance(node, ast.Name) and node.id in aliases)


def _scope(node: ast.AST):
    """The nodes of one function (or of the module outside its functions), not those of the functions inside it."""
    for child in ast.iter_child_nodes(node):
        yield child
        if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield from _scope(child)


def _key_problems(path: Path) -> list[str]:
    """'file:line: key' for each attribute key written or read that is not a schema name: a string literal, or a
    name that no loop of its function binds (a loop passes on keys of a dict built with schema names). A key that
    a call computes is another package's (optuna-dashboard's note keys)."""
    tree = ast.parse(path.read_text())
    name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
    problems = []
    for scope in [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))]:
        nodes = list(_scope(scope))
        aliases = {t.id for n in nodes if isinstance(n, ast.Assign) and _holds_attrs(n.value, set())
                   for t in n.targets if isinstance(t, ast.Name)}
        looped = {t.id for n in nodes if isinstance(n, (ast.For, ast.comprehension)) for t in ast.walk(n.target)
                  if isinstance(t, ast.Name)}
        keys = []
        for n in nodes:
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
                if n.func.attr in WRITERS and len(n.args) > WRITERS[n.func.attr]:
                    keys.append(n.args[WRITERS[n.func.attr]])
                if n.func.attr == "get" and _holds_attrs(n.func.value, aliases) and n.args:
                    keys.append(n.args[0])
                for kw in n.keywords:
                    if kw.arg == "user_attrs" and isinstance(kw.value, ast.Dict):
                        keys += [k for k in kw.value.keys if k is not None]  # None: a **splat of checked keys
            elif isinstance(n, ast.Subscript) and _holds_attrs(n.value, aliases):
                keys.append(n.slice)
            elif isinstance(n, ast.Compare) and any(_holds_attrs(c, aliases) for c in n.comparators):
                keys.append(n.left)
        for key in keys:
            named = isinstance(key, ast.Attribute) and isinstance(key.value, ast.Name) and key.value.id == "schema"
            passed_on = isinstance(key, ast.Name) and key.id in looped  # e.g. `for key, value in found.items()`
            if not (named or passed_on or isinstance(key, ast.Call)):
                problems.append(f"{name}:{key.lineno}: {ast.unparse(key)}")
    return sorted(set(problems))


def test_search_names_every_attribute_it_writes_or_reads_through_the_schema_module():
    modules = [p for p in sorted((ROOT / "search").rglob("*.py")) if p.name != "schema.py"]
    problems = [line for path in modules for line in _key_problems(path)]
    assert problems == []


def test_the_key_check_finds_a_string_literal_and_a_name_defined_outside_the_schema(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('WORKER = "worker"\n\ndef f(trial, study):\n    trial.set_user_attr("status", 1)\n    trial.set_user_attr(WORKER, 1)\n'
                   '    study.enqueue_trial({}, user_attrs={"proposer": "x"})\n    a = trial.user_attrs\n    return a.get("rule")\n')
    problems = sorted(line.split(": ", 1)[1] for line in _key_problems(bad))
    assert problems == ["'proposer'", "'rule'", "'status'", "WORKER"]


# ------------------------------------------------------------------------------------------------
# The measurement attribute, and storages written before it.
# ------------------------------------------------------------------------------------------------


def _as_before_the_measurement_attribute(attrs: dict) -> dict:
    """A trial's attributes as the writer before `measurement` stored them (its parts, each an attribute)."""
    m = Measurement.from_dict(attrs[schema.MEASUREMENT])
    old = {k: v for k, v in attrs.items() if k != schema.MEASUREMENT}
    old.update({schema.RESULTS: [r.to_dict() for r in m.results], schema.EVALUATOR: m.evaluator,
                schema.ERRORS: {r.problem: r.max_errors for r in m.results if r.max_errors}})
    if m.static:
        old[schema.STATIC] = m.static
    return old


def test_a_trial_stored_before_the_measurement_attribute_reads_as_the_same_record_and_note(tmp_path):
    from search.reviewing.evidence import load_study
    from search.reviewing.notes import trial_note

    loop, _, _ = make_loop(write_table(tmp_path), n_trials=3, confirmations=0)
    loop.run()
    new = next(t for t in loop.study.get_trials() if schema.MEASUREMENT in t.user_attrs)
    old_study = optuna.create_study(storage=loop.storage, study_name="written-before", direction="maximize")
    for key, value in loop.study.user_attrs.items():
        old_study.set_user_attr(key, value)
    old_study.add_trial(optuna.trial.create_trial(params=new.params, distributions=new.distributions, value=new.value,
                                                  user_attrs=_as_before_the_measurement_attribute(new.user_attrs),
                                                  intermediate_values=new.intermediate_values))
    old = old_study.get_trials()[0]
    assert schema.MEASUREMENT not in old.user_attrs
    assert record(old) == replace(record(new), number=0)
    assert record(old).results and record(old).evaluator == "replay"
    ev_new, ev_old = load_study(loop.storage, loop.study.study_name), load_study(loop.storage, "written-before")
    assert trial_note(ev_old, record(old)) == trial_note(ev_new, record(new))


def test_the_report_reads_a_storage_written_before_the_measurement_attribute(tmp_path):
    copy = tmp_path / LEGACY_STORAGE.name
    shutil.copy(LEGACY_STORAGE, copy)
    done = run_cli("report", "--storage", f"sqlite:///{copy}")
    assert done.returncode == 0, done.stderr
    assert "winner #79 confirmed 2 times (329.4, 329.8)" in done.stdout
    history = records(optuna.load_study(study_name=STUDY, storage=open_storage(f"sqlite:///{copy}")))
    winner = next(r for r in history if r.number == 79)
    # what apply, export, the notes, the plots and Claude's prompt read from the measurement's parts
    assert winner.evaluator == "gpu" and winner.static["registers"] > 0
    assert [r.status for r in winner.results] == ["ok", "ok"] and all(r.max_errors for r in winner.results)


@pytest.mark.parametrize("attrs,expected", [
    ({}, {}),
    ({schema.STATUS: "infeasible", schema.RULE: "smem"}, {}),
    ({schema.STATIC: {"registers": 8}, schema.EVALUATOR: "gpu"}, {"static": {"registers": 8}, "evaluator": "gpu"}),
])
def test_stored_measurement_is_empty_for_a_trial_never_evaluated_and_falls_back_to_the_old_parts(attrs, expected):
    from search.storing.history import stored_measurement

    found = stored_measurement(attrs)
    assert {k: v for k, v in found.items() if k in expected} == expected and (found == {}) == (expected == {})
