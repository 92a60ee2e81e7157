"""The Claude proposer through the real anthropic client against a local Messages API server, inside the
full loop on a replayed SYNTHETIC table: good proposals, malformed tool input, out-of-domain and infeasible
proposals, 429 then success, 529, a timeout, a refused connection, a refused key, no key."""

from __future__ import annotations

import socket

import optuna
import pytest

from fa4tune.config import ForwardConfig
from search.proposing import claude as claude_module
from search.proposing.claude import ClaudeProposer
from search.storing import schema
from search.storing.history import records
from search.storing.storage import open_storage
from fake_messages_api import FakeMessagesAPI, error_reply, input_reply, slow_reply, text_reply, tool_reply
from search_helpers import make_loop, replay_args, run_cli, write_table


@pytest.fixture(autouse=True)
def no_real_credentials(monkeypatch):
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def sleeps(monkeypatch):
    """Backoff delays the proposer asked for (not slept)."""
    calls = []
    monkeypatch.setattr(claude_module.time, "sleep", calls.append)
    return calls


def _claude(api, **kwargs) -> ClaudeProposer:
    settings = {"api_key": "test-key", "base_url": api.url if api else None, "backoff_s": 0.01, "timeout_s": 5.0, "retries": 2, "model": "test-model"}
    return ClaudeProposer(**{**settings, **kwargs})


def _by(loop, proposer):
    return [t for t in loop.study.trials if t.user_attrs.get(schema.PROPOSER) == proposer]


def test_good_proposals_are_measured_with_their_rationale_and_the_model_sees_the_rules_and_history(tmp_path):
    with FakeMessagesAPI() as api:
        proposer = _claude(api)
        loop, evaluator, view = make_loop(write_table(tmp_path), proposers=[proposer], n_trials=8, k=2, confirmations=0)
        loop.run()
    claude_trials = _by(loop, "claude")
    assert len(claude_trials) >= 3 and _by(loop, "tpe")
    assert all(t.user_attrs[schema.RATIONALE].startswith("fake model: listed feasible config") for t in claude_trials)
    assert all(t.user_attrs[schema.EVALUATED] and t.user_attrs[schema.STATUS] == "ok" for t in claude_trials)
    first = api.requests[0]
    assert first["model"] == "test-model" and "test-key" in (api.headers[0].get("X-Api-Key") or api.headers[0].get("Authorization", ""))
    assert first["tool_choice"] == {"type": "tool", "name": "propose_configs"}
    knobs = first["tools"][0]["input_schema"]["properties"]["proposals"]["items"]["properties"]["config"]["properties"]
    assert knobs["tile_m"]["enum"] == [64, 128, 192, 256] and knobs["Q_in_regs"]["enum"] == [False, True]
    assert "fit in 101376 B" in first["system"]  # the shared-memory formula, and every rule with an example:
    assert "- smem_capacity: needs" in first["system"] and "- Q_in_regs_one_stage: Q_in_regs needs num_stages=1" in first["system"]
    assert "Problem class d128-causal-bf16" in api.prompt(0) and "b1 s8192 h16 d128 causal" in api.prompt(0)
    later = api.prompt(len(api.requests) - 1)
    assert '"proposer": "baseline"' in later and '"geomean_tflops"' in later and '"tflops": {"b1 s8192 h16 d128 causal"' in later
    assert "fake model: listed feasible config" in later  # earlier rationales are shown back


def test_malformed_tool_input_goes_back_to_the_model_and_the_sampler_takes_the_turn(tmp_path):
    script = [
        input_reply({"proposals": '[{"config": {"tile_m": 128'}),
        input_reply({"proposals": [{"rationale": "forgot the config"}, "not an object"]}),
        text_reply("I would rather talk about tiles."),
    ]
    with FakeMessagesAPI(script) as api:
        loop, evaluator, view = make_loop(write_table(tmp_path), proposers=[_claude(api)], n_trials=8, k=2, confirmations=0, pass_cooldown=0)
        outcome = loop.run()
    assert outcome.evaluated == 8
    assert "'proposals' is not valid JSON" in api.prompt(1)
    assert "each proposal must be an object with 'config' and 'rationale'" in api.prompt(2)
    assert "the reply had no propose_configs tool call" in api.prompt(3) and "talk about tiles" in api.prompt(3)
    assert sum("the sampler takes the turn" in m for m in view.messages) >= 3
    assert _by(loop, "claude")  # the fourth turn is well formed


def test_out_of_domain_wrong_type_and_infeasible_proposals_never_reach_the_evaluator(tmp_path):
    base = ForwardConfig(tile_m=128, tile_n=64, num_threads=256).to_dict()
    bad = [
        {"config": {**base, "tile_m": 512}, "rationale": "a huge tile"},
        {"config": {**base, "tile_m": 192, "tile_n": 128}, "rationale": "fills shared memory"},
        {"config": {**base, "num_threads": "256"}, "rationale": "a string"},
        {"config": {**base, "warp_specialize": True}, "rationale": "an unknown knob"},
    ]
    with FakeMessagesAPI([tool_reply(bad)]) as api:
        loop, evaluator, view = make_loop(write_table(tmp_path), proposers=[_claude(api)], n_trials=6, k=4, confirmations=0, pass_cooldown=0)
        loop.run()
    evaluated = [c for _, _, c in evaluator.calls]
    # The rejected proposals themselves never reach the evaluator (the sampler may still pick a feasible 192-row tile).
    assert not any(c["tile_m"] == 512 for c in evaluated)
    assert not any(c["tile_m"] == 192 and c["tile_n"] == 128 and c["kernel"] == "sm120" for c in evaluated)
    assert not any(isinstance(c["num_threads"], str) or "warp_specialize" in c for c in evaluated)
    feedback = api.prompt(1)
    assert "tile_m=512 is not in the search domain" in feedback
    assert "infeasible: smem_capacity: needs 114688 B of shared memory" in feedback
    assert "num_threads must be an integer" in feedback and "has no knob 'warp_specialize'" in feedback
    assert loop.study.user_attrs[schema.REJECTED_PROPOSALS] == {"claude": 4}


def test_rate_limited_once_then_the_retry_succeeds(tmp_path, sleeps):
    with FakeMessagesAPI([error_reply(429)]) as api:
        loop, _, view = make_loop(write_table(tmp_path), proposers=[_claude(api)], n_trials=4, k=2, confirmations=0)
        loop.run()
    assert sleeps[0] == 0.01 and len(_by(loop, "claude")) >= 2
    assert not any("claude" in m for m in view.messages)  # the turn did not pass


def test_overloaded_529_is_retried_with_backoff_then_the_sampler_takes_the_turn(tmp_path, sleeps):
    with FakeMessagesAPI([error_reply(529)] * 3) as api:
        loop, _, view = make_loop(write_table(tmp_path), proposers=[_claude(api)], n_trials=8, k=2, confirmations=0)
        outcome = loop.run()
    assert sleeps[:2] == [0.01, 0.02]  # exponential backoff between the 3 attempts
    assert any("API unavailable after 3 attempts (OverloadedError 529)" in m for m in view.messages)
    assert outcome.evaluated == 8 and _by(loop, "claude")  # a later turn reached the model again


def test_a_timeout_passes_the_turn_and_nothing_crashes(tmp_path):
    with FakeMessagesAPI([slow_reply(1.5)]) as api:
        loop, _, view = make_loop(write_table(tmp_path), proposers=[_claude(api, timeout_s=0.3, retries=0)], n_trials=5, k=2, confirmations=0)
        outcome = loop.run()
    assert any("APITimeoutError" in m for m in view.messages)
    assert outcome.evaluated == 5


def test_a_refused_connection_passes_the_turn(tmp_path, sleeps):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    proposer = _claude(None, base_url=f"http://127.0.0.1:{port}", retries=1)
    loop, _, view = make_loop(write_table(tmp_path), proposers=[proposer], n_trials=5, confirmations=0)
    outcome = loop.run()
    assert any("APIConnectionError" in m for m in view.messages) and outcome.evaluated == 5
    assert not _by(loop, "claude")


def test_a_refused_key_is_said_once_and_the_sampler_takes_every_turn(tmp_path):
    with FakeMessagesAPI([error_reply(401)]) as api:
        loop, _, view = make_loop(write_table(tmp_path), proposers=[_claude(api)], n_trials=6, confirmations=0)
        loop.run()
    assert len(api.requests) == 1
    assert sum("API refused the key" in m for m in view.messages) == 1
    assert not _by(loop, "claude")


def test_no_key_says_so_once_and_the_sampler_takes_the_turns(tmp_path):
    with FakeMessagesAPI() as api:
        proposer = ClaudeProposer(api_key=None, base_url=api.url)
        loop, _, view = make_loop(write_table(tmp_path), proposers=[proposer], n_trials=6, confirmations=0)
        loop.run()
    assert api.requests == []
    assert [m for m in view.messages if "ANTHROPIC_API_KEY" in m] == ["claude: no ANTHROPIC_API_KEY set: the sampler takes claude's turns"]
    # the sampler's turns, and the loop's explore turns when the sampler repeats itself; none is claude's
    assert {"baseline", "tpe"} <= {t.user_attrs[schema.PROPOSER] for t in loop.study.trials} <= {"baseline", "tpe", "explore"}


def test_the_command_line_run_takes_key_and_endpoint_from_the_environment(tmp_path):
    table = write_table(tmp_path)
    url = f"sqlite:///{tmp_path / 'search.db'}"
    with FakeMessagesAPI() as api:
        done = run_cli(*replay_args(url, table, "--n-trials", "6", "--k", "2", "--confirmations", "0", "--api-backoff", "0.01"),
                       env={"ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": api.url})
    assert done.returncode == 0, done.stderr
    assert api.requests and "test-key" in (api.headers[0].get("X-Api-Key") or api.headers[0].get("Authorization", ""))
    study = optuna.load_study(study_name="fwd:d128-causal-bf16:sm120", storage=open_storage(url))
    assert any(r.proposer == "claude" and r.rationale for r in records(study))
    report = run_cli("report", "--storage", url)
    assert report.returncode == 0 and "claude" in report.stdout
