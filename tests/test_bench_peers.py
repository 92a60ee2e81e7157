"""bench/peers.py and its parts on the CPU: .peers/'s assembly and its refusals (bench/peer_sources.py), #2771's
configs through our backward classes and the autotuner's candidate lists (bench/peer_configs.py), #2634's
candidates' eligibility and kernel record (bench/peer_candidates.py), the plan, the candidates of one step, and the
summary from synthetic step results; one sm_120a compile of the peers' kernels (marked compile, needs .peers/)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import types

import pytest

from bench import peer_candidates, peer_configs, peer_sources, peers
from fa4tune import upstream
from fa4tune.config import BackwardConfig, ForwardConfig, Problem
from fa4tune.harness.measurement import ProblemResult
from fa4tune.suites import load_suite
from fa4tune.targets import get_target
from search_helpers import ROOT

TARGET = get_target()
CONFIG = upstream.config_module()
NUM_SMS = 132


# ---- .peers/: assembly, check, refusal ----

def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture
def clone(tmp_path):
    """A repository with a flash_attn/cute package at one commit: interface imports utils (absolute) and mask
    (relative), __init__ imports interface; unused.py is imported by nothing."""
    repo = tmp_path / "repo"
    cute = repo / "flash_attn" / "cute"
    cute.mkdir(parents=True)
    (cute / "__init__.py").write_text("from .interface import run\n")
    (cute / "interface.py").write_text("from flash_attn.cute import utils\nimport flash_attn.cute.mask\n"
                                       "def run():\n    return utils.x + flash_attn.cute.mask.y\n")
    (cute / "utils.py").write_text("x = 1\n")
    (cute / "mask.py").write_text("y = 2  # flash_attn.cute.mask\n")
    (cute / "unused.py").write_text("z = 3\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "peer")
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    skeleton = {"upstream": "o/r", "peers": [
        {"name": "pra", "ref": "refs/pull/1/head", "commit": commit, "package": "fa4tune_peer_test_pra", "roots": ["__init__"]},
        {"name": "prb", "ref": "refs/pull/2/head", "commit": commit, "package": None, "roots": ["flash_attn/cute/mask.py"]},
    ]}
    return repo, peer_sources.record(repo, skeleton)


def test_record_takes_the_import_closure_and_assemble_rewrites_the_package_name(clone, tmp_path):
    repo, manifest = clone
    pra, prb = manifest["peers"]
    assert [f["path"] for f in pra["files"]] == [f"flash_attn/cute/{m}.py" for m in ("__init__", "interface", "mask", "utils")]
    assert [f["path"] for f in prb["files"]] == ["flash_attn/cute/mask.py"]
    out = tmp_path / "peers"
    written = peer_sources.assemble(repo, manifest, out)
    assert written == sum(f["bytes"] for p in manifest["peers"] for f in p["files"])
    interface = (out / "fa4tune_peer_test_pra" / "interface.py").read_text()
    assert "from fa4tune_peer_test_pra import utils" in interface and "flash_attn" not in interface
    assert (out / "prb" / "flash_attn" / "cute" / "mask.py").read_text() == "y = 2  # flash_attn.cute.mask\n"  # verbatim
    assert peer_sources.check(out, manifest) == []
    sys.path.insert(0, str(out))
    try:
        assert __import__("fa4tune_peer_test_pra").run() == 3  # the assembled package imports on its own name
    finally:
        sys.path.remove(str(out))
        for name in [n for n in sys.modules if n.startswith("fa4tune_peer_test_pra")]:
            del sys.modules[name]


def test_check_names_a_missing_folder_a_changed_file_a_missing_file_and_a_stray_module(clone, tmp_path):
    repo, manifest = clone
    out = tmp_path / "peers"
    with pytest.raises(peer_sources.PeersMissing, match=r"peers: .*peers is missing: assemble it with .*refs/pull/1/head"):
        peer_sources.require(out, manifest)
    peer_sources.assemble(repo, manifest, out)
    utils = out / "fa4tune_peer_test_pra" / "utils.py"
    utils.write_text("x = 100\n")
    (out / "prb" / "flash_attn" / "cute" / "mask.py").unlink()
    (out / "fa4tune_peer_test_pra" / "extra.py").write_text("")
    problems = peer_sources.check(out, manifest)
    assert len(problems) == 3
    assert problems[0].startswith(f"peers: {utils} has sha256 ") and "pra flash_attn/cute/utils.py" in problems[0]
    assert "mask.py is missing" in problems[2 if "extra" in problems[1] else 1]
    assert any("holds extra.py, which the manifest does not name" in p for p in problems)
    with pytest.raises(peer_sources.PeersMissing, match=r"has sha256 .* \(and 2 more\)"):
        peer_sources.require(out, manifest)


def test_assemble_refuses_a_blob_other_than_the_manifests_and_a_commit_without_the_file(clone, tmp_path):
    repo, manifest = clone
    changed = json.loads(json.dumps(manifest))
    changed["peers"][0]["files"][1]["blob_sha256"] = "0" * 64
    with pytest.raises(peer_sources.PeersMissing, match=r"interface.py has sha256 [0-9a-f]{64}, the manifest 0{64}"):
        peer_sources.assemble(repo, changed, tmp_path / "a")
    changed = json.loads(json.dumps(manifest))
    changed["peers"][1]["files"][0]["path"] = "flash_attn/cute/gone.py"
    with pytest.raises(peer_sources.PeersMissing, match=r"gone.py is not in commit .* \(fetch refs/pull/2/head of https://github.com/o/r\)"):
        peer_sources.assemble(repo, changed, tmp_path / "b")


def test_the_command_line_and_the_bench_refuse_without_peers_with_one_line(tmp_path, monkeypatch, capsys):
    done = subprocess.run([sys.executable, "bench/peer_sources.py", "check", "--out", str(tmp_path / "none")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error: peers: ") and done.stderr.count("\n") == 1 and "is missing" in done.stderr
    monkeypatch.setattr(peer_sources, "PEERS_DIR", tmp_path / "none")
    assert peers.main(["--suites", "quick", "--compile-jobs", "0"]) == 2  # before anything is planned or compiled
    assert capsys.readouterr().err.startswith("error: peers: ")


def test_the_committed_manifest_names_both_peers_at_their_commits_and_stays_small():
    manifest = peer_sources.load_manifest()
    names = {p["name"]: p for p in manifest["peers"]}
    assert set(names) == {"pr2634", "pr2771"}
    for p in manifest["peers"]:
        assert len(p["commit"]) == 40 and p["ref"] == f"refs/pull/{p['name'][2:]}/head"
        assert all(len(f["sha256"]) == 64 and len(f["blob_sha256"]) == 64 for f in p["files"])
    paths = {f["path"] for f in names["pr2634"]["files"]}
    assert {f"flash_attn/cute/{m}.py" for m in ("interface", "flash_fwd_sm120_tma", "flash_fwd_decode_sm120")} <= paths
    assert names["pr2634"]["package"] == peer_candidates.PR2634_PACKAGE and names["pr2771"]["package"] is None
    assert sum(f["bytes"] for p in manifest["peers"] for f in p["files"]) < peer_sources.MAX_BYTES  # carried with the tree
    assert "/.peers/" in (ROOT / ".gitignore").read_text().split()


# ---- #2771's configs through our classes ----

def _problem(b, sq, sk, h, hkv, d, causal, **kw):
    return Problem(b, sq, sk, h, hkv, d, d, causal, name=f"b{b} sq{sq} sk{sk} h{h}/{hkv} d{d}{' causal' if causal else ''}", **kw)


def test_pr2771_knobs_follow_its_rule():
    base = peer_configs.pr2771_backward(_problem(2, 2048, 2048, 16, 16, 128, False), NUM_SMS)
    assert base.config == BackwardConfig(64, 64, 1, 1, 256, AtomLayoutNdKV=2)  # 256 threads; d128: AtomLayoutNdKV 2
    assert base.postprocess_dQ_threads == 128 and not base.skip_full_causal_mask
    # d64: 64x128 once the 128-key grid fills two waves of the SMs (32 * 8 * 16 = 4096 >= 264), not below
    assert peer_configs.pr2771_backward(_problem(8, 1024, 1024, 32, 32, 64, False), NUM_SMS).config.n_block_size == 128
    assert peer_configs.pr2771_backward(_problem(1, 1024, 1024, 8, 8, 64, False), NUM_SMS).config.n_block_size == 64
    # long d64 with 64x128: P and dS in registers, one Q stage
    rs = peer_configs.pr2771_backward(_problem(1, 8192, 8192, 16, 16, 64, False), NUM_SMS).config
    assert (rs.SdP_swapAB, rs.AtomLayoutMSdP, rs.AtomLayoutNdKV, rs.num_stages_Q) == (True, 1, 8, 1)
    # long d128 MHA square: two Q stages, V in registers, AtomLayoutMdQ 2 (dQ postprocess on 256), the mask skipped
    long = peer_configs.pr2771_backward(_problem(1, 8192, 8192, 16, 16, 128, True), NUM_SMS)
    assert (long.config.num_stages_Q, long.config.V_in_regs, long.config.AtomLayoutMdQ) == (2, True, 2)
    assert long.skip_full_causal_mask and long.postprocess_dQ_threads == 256
    gqa = peer_configs.pr2771_backward(_problem(1, 8192, 8192, 32, 8, 128, True), NUM_SMS)  # GQA: no V in registers
    assert (gqa.config.num_stages_Q, gqa.config.V_in_regs, gqa.skip_full_causal_mask) == (2, False, False)
    window = peer_configs.pr2771_backward(_problem(8, 1024, 1024, 32, 32, 64, True, window_size_left=256), NUM_SMS)
    assert window.config.n_block_size == 64  # a local window keeps 64x64


def test_express_pr2771_times_what_our_classes_take_and_names_what_they_cannot():
    plain = _problem(2, 2048, 2048, 16, 16, 128, False)
    expressed = peer_configs.express_pr2771(peer_configs.pr2771_backward(plain, NUM_SMS), plain, TARGET)
    assert expressed.config == dataclasses.replace(peer_configs.pr2771_backward(plain, NUM_SMS).config, kernel="sm120")
    assert expressed.label.startswith("sm120; without: fp32x4 vector atomics") and "128-thread dQ postprocess" in expressed.label
    causal = _problem(2, 2048, 2048, 16, 16, 128, True)  # 8 warps, 4 along m: our coordinate-mask class
    assert peer_configs.express_pr2771(peer_configs.pr2771_backward(causal, NUM_SMS), causal, TARGET).config.kernel == "sm120_cmask"
    cases = {
        _problem(8, 1024, 1024, 32, 32, 64, True): ("64x128 causal blocks", "rule causal_bwd_square_blocks"),
        _problem(1, 8192, 8192, 16, 16, 128, False): ("V in registers", "rule V_in_regs_wrong_gradients"),
        _problem(1, 8192, 8192, 16, 16, 64, False): ("register-resident P/dS", "rule SdP_swapAB_"),
    }
    for p, (feature, rule) in cases.items():
        e = peer_configs.express_pr2771(peer_configs.pr2771_backward(p, NUM_SMS), p, TARGET)
        assert e.config is None and e.label.startswith(f"cannot express: {feature}") and rule in e.label, (p.label, e.label)
    long_causal = _problem(1, 8192, 8192, 16, 16, 128, True)
    e = peer_configs.express_pr2771(peer_configs.pr2771_backward(long_causal, NUM_SMS), long_causal, TARGET)
    assert "V in registers" in e.cannot and e.cannot.endswith("skip_full_causal_mask (a kernel argument of theirs)")


PR2771_INTERFACE = ROOT / ".peers" / "pr2771" / "flash_attn" / "cute" / "interface.py"


@pytest.mark.skipif(not PR2771_INTERFACE.exists(), reason="needs .peers/ (python3 bench/peer_sources.py assemble --git <clone>)")
def test_the_lines_the_transcription_cites_hold_its_numbers():
    lines = PR2771_INTERFACE.read_text().splitlines()
    cited = {1907: "_grid_n128 = ((k.shape[1] + 127) // 128) * q.shape[-2] * q.shape[0]", 1909: "_grid_n128 >= 2 * _sm_count",
             1943: "AtomLayoutNdKV = 8", 1947: "AtomLayoutNdKV = 2", 1967: "V_in_regs = True", 1973: "num_threads = 256",
             2683: "num_threads_post_dQ = num_threads if AtomLayoutMdQ == 2 else 128"}
    for number, text in cited.items():
        assert text in lines[number - 1], (number, lines[number - 1])
    assert sum("q.shape[1] >= 8192" in line for line in lines[1890:1975]) == 3  # RS, two Q stages, long d128


# ---- the autotuner's candidates ----

def test_autotune_own_takes_the_selectors_tiles_and_pack_gqa_where_the_rules_admit_them():
    mha, gqa = _problem(1, 4096, 4096, 16, 16, 128, True), _problem(1, 4096, 4096, 32, 8, 128, True)
    own = peer_configs.autotune_own(CONFIG, mha, NUM_SMS, TARGET)
    assert [(c.tile_m, c.tile_n, c.pack_gqa) for c in own] == [(128, 128, False), (128, 64, False)]
    own = peer_configs.autotune_own(CONFIG, gqa, NUM_SMS, TARGET)
    assert [(c.tile_m, c.tile_n, c.pack_gqa) for c in own] == [(128, 128, True), (128, 128, False), (128, 64, True), (128, 64, False)]
    assert all(isinstance(c, CONFIG.FwdConfig) and c.num_splits == 1 and c.device_capacity == 12 for c in own)
    d256 = next(p for p in load_suite("wide") if p.head_dim == 256)
    assert peer_configs.autotune_own(CONFIG, d256, NUM_SMS, TARGET) == []  # 128x64 needs 131072 B of 101376
    assert peer_configs.autotune_refusal(dataclasses.replace(mha, softcap=30.0)) == "autotune does not support softcap"
    assert peer_configs.autotune_refusal(dataclasses.replace(mha, dtype="fp8")).startswith("autotune takes bf16 and fp16")


def test_our_feasible_space_reaches_the_autotuner_as_its_configs_and_the_rest_is_counted():
    p = _problem(1, 4096, 4096, 32, 8, 128, False)
    feasible = [ForwardConfig(128, 64, 128, 1, False), ForwardConfig(64, 128, 128, 1, False), ForwardConfig(128, 64, 128, 1, False),
                ForwardConfig(128, 64, 256, 1, False), ForwardConfig(128, 64, 128, 2, False), ForwardConfig(128, 64, 128, 1, True),
                ForwardConfig(64, 64, 128, 1, False, kernel="sm120_tma"), ForwardConfig(64, 64, 128, 1, False, kernel="sm120_tma")]
    configs, refused = peer_configs.autotune_handover(CONFIG, p, NUM_SMS, feasible)
    assert [(c.tile_m, c.tile_n) for c in configs] == [(128, 64), (64, 128)]  # distinct, in our order
    default = CONFIG.select_fwd_config(peer_configs.fwd_inputs(CONFIG, p, NUM_SMS))
    assert all(c.pack_gqa == default.pack_gqa is True and c.num_splits == 1 for c in configs)  # the selector's pack_gqa
    assert refused == {"num_threads != 128 (its SM120 interface passes 128)": 1, "num_stages != 1 (its SM120 interface passes 1)": 1,
                       "Q_in_regs (its SM120 interface passes False)": 1, "kernel sm120_tma (FwdConfig runs upstream's class only)": 2}
    assert peer_configs.as_ours(configs[1]) == ForwardConfig(64, 128, 128, 1, False)
    assert peer_configs.describe(configs[0]) == "128x64 pack_gqa"
    # upstream's own validation refuses what SM120's forward cannot run (one split)
    with pytest.raises(ValueError, match="num_splits"):
        CONFIG.derive_fwd_config(default, peer_configs.fwd_inputs(CONFIG, p, NUM_SMS), num_splits=2)


def test_a_window_reaches_the_autotuners_inputs_as_upstreams_interface_resolves_it():
    causal_window = _problem(1, 4096, 4096, 32, 8, 128, True, window_size_left=1024)
    inputs = peer_configs.fwd_inputs(CONFIG, causal_window, NUM_SMS)
    assert (inputs.causal, inputs.local, inputs.window_size_left, inputs.window_size_right) == (False, True, 1024, 0)
    plain = peer_configs.fwd_inputs(CONFIG, _problem(1, 4096, 4096, 32, 8, 128, True), NUM_SMS)
    assert (plain.causal, plain.local, plain.window_size_left) == (True, False, None)


# ---- #2634's candidates ----

def test_pr2634_variants_run_where_they_apply():
    prefill, gqa = _problem(1, 4096, 4096, 16, 16, 128, True), _problem(1, 4096, 4096, 32, 8, 128, True)
    decode = Problem(4, 1, 8192, 32, 8, 128, 128, False, backward=False, name="decode")
    eligible = peer_candidates.pr2634_eligible
    assert eligible(prefill, "fwd", "pr2634") == eligible(prefill, "bwd", "pr2634") == ""  # its dispatch, both directions
    assert eligible(prefill, "fwd", "pr2634_unpacked").startswith("the dispatch's own call here")
    assert eligible(gqa, "fwd", "pr2634_unpacked") == "" and eligible(gqa, "bwd", "pr2634_unpacked") == "forward only"
    assert eligible(decode, "fwd", "pr2634_decode") == ""
    assert eligible(dataclasses.replace(decode, seqlen_q=4), "fwd", "pr2634_decode").startswith("its decode kernel runs one-token")
    assert eligible(dataclasses.replace(decode, head_dim=64, head_dim_v=64), "fwd", "pr2634_decode").endswith("128 and 256 only")
    assert eligible(dataclasses.replace(prefill, dtype="fp8"), "fwd", "pr2634") == "#2634 has no fp8 path"


def test_the_kernel_recorder_names_the_kernel_each_call_ran():
    class Kernel:
        def __init__(self, *args, **kwargs):
            self.args = args

    def dispatch(key, tile_m):
        if key not in dispatch.compile_cache:
            interface.FlashAttentionForwardSm120Tma(tile_m=tile_m, tile_n=64, kv_stages=2)
            dispatch.compile_cache[key] = lambda: "ran"
        return dispatch.compile_cache[key]()

    dispatch.compile_cache, dispatch.decode_compile_cache = {}, {}
    interface = types.SimpleNamespace(_flash_attn_fwd=dispatch, **{name: Kernel for name in peer_candidates.PR2634_KERNELS})
    recorder = peer_candidates.KernelRecorder(interface)
    recorder.current = "pr2634"
    assert dispatch(("a",), 128) == "ran" and dispatch(("a",), 128) == "ran"  # built once, run twice
    recorder.kernels[repr(("b",))] = "sm120 64x96 (built in a compile process)"
    dispatch.compile_cache._cache[("b",)] = lambda: "ran"  # loaded: nothing built here
    recorder.current = "pr2634_unpacked"
    dispatch(("b",), 64)
    dispatch.compile_cache._cache[("c",)] = lambda: "ran"
    dispatch(("c",), 64)
    assert recorder.take() == [("pr2634", "tma 128x64 kv_stages=2"), ("pr2634", "tma 128x64 kv_stages=2"),
                               ("pr2634_unpacked", "sm120 64x96 (built in a compile process)"), ("pr2634_unpacked", "loaded")]
    assert recorder.take() == []
    assert peer_candidates.describe_kernel("FlashAttentionDecodeSm120", ("bf16", 128, 128, 4, 8), {"tile_n": 64, "num_threads": 128}) \
        == "decode n64 num_threads=128 num_splits=8"


def test_the_decode_kernel_switch_is_set_only_inside_the_call(monkeypatch):
    monkeypatch.delenv(peer_candidates.DECODE_ENV, raising=False)
    with peer_candidates.decode_kernel_on(True):
        assert peer_candidates.os.environ[peer_candidates.DECODE_ENV] == "1"
    assert peer_candidates.DECODE_ENV not in peer_candidates.os.environ
    monkeypatch.setenv(peer_candidates.DECODE_ENV, "0")
    with peer_candidates.decode_kernel_on(True):
        pass
    assert peer_candidates.os.environ[peer_candidates.DECODE_ENV] == "0"


# ---- the plan and one step ----

@pytest.fixture(scope="module")
def experiment_module():
    from fa4tune.harness.candidates import load_experiment
    from fa4tune.harness.settings import EXPERIMENT_PATH

    return load_experiment(EXPERIMENT_PATH)


def test_plan_gives_every_step_each_peers_part_or_the_reason_it_is_not_run(experiment_module):
    steps = peers.plan(["generalization"], experiment_module, CONFIG, TARGET, NUM_SMS)
    problems = load_suite("generalization")
    assert len(steps) == sum(2 if p.backward else 1 for p in problems)
    for ps in steps:
        p, direction = ps.step.problem, ps.step.direction
        if direction == "bwd":
            assert not ps.autotune and ps.not_run["autotune_own"] == "forward only" and ps.pr2771 is not None
            assert (ps.pr2771.config is None) == ("pr2771" in ps.not_run)
        else:
            assert set(ps.autotune) == {"autotune_own", "autotune_ours"} and ps.not_run["pr2771"] == "backward only"
            assert len(ps.autotune["autotune_ours"]) > len(ps.autotune["autotune_own"]) and ps.handover
        assert "pr2634" in ps.pr2634 and all(v not in ps.not_run for v in ps.pr2634)
        assert ("pr2634_unpacked" in ps.pr2634) == (direction == "fwd" and p.num_heads != p.num_heads_kv
                                                    and p.problem_class.regime != "decode")
    only = peers.plan(["generalization"], experiment_module, CONFIG, TARGET, NUM_SMS, directions=("fwd",), peers=("pr2771",))
    assert all(ps.not_run == {"pr2771": "backward only"} and not ps.autotune and not ps.pr2634 for ps in only)
    assert [len(peers.take_part(list(range(10)), f"{i}/3")) for i in (1, 2, 3)] == [4, 4, 2]
    with pytest.raises(SystemExit, match="part"):
        peers.take_part([1], "4/3")


def test_compile_ahead_covers_ours_and_the_peers_kernels(experiment_module):
    steps = peers.plan(["standard"], experiment_module, CONFIG, TARGET, NUM_SMS)
    pairs = peers.compile_pairs_of(steps)
    for ps in steps:
        if ps.pr2771 is not None and ps.pr2771.config is not None:
            assert ("bwd", ps.pr2771.config, ps.step.problem) in pairs
    jobs = peers.peer_jobs(steps, lambda p: [p, dataclasses.replace(p, seqlen_k=p.seqlen_k - 37)])
    autotune = [j for j in jobs if j["kind"] == "autotune"]
    classes = {ps.step.problem.problem_class for ps in steps if ps.autotune}
    assert sum(j["config"] is None for j in autotune) == len(classes)  # the default, each class once
    assert len({(json.dumps(j["config"], sort_keys=True), json.dumps(j["shapes"])) for j in autotune}) == len(autotune)
    pr2634 = [j for j in jobs if j["kind"] == "pr2634"]
    assert len(pr2634) == sum(len(ps.pr2634) for ps in steps) and all(len(j["shapes"]) == 2 for j in pr2634)


def test_one_step_holds_every_candidate_and_two_equal_picks_are_timed_once(experiment_module, monkeypatch):
    from fa4tune.harness import candidates as harness_candidates

    made = []
    monkeypatch.setattr(harness_candidates, "experiment_candidate",
                        lambda module, fwd, bwd, name: made.append((name, fwd, bwd)) or harness_candidates.Candidate(name, None, {}))
    monkeypatch.setattr(peer_candidates, "autotune_candidate", lambda name, pick: harness_candidates.Candidate(name, None, {}))
    monkeypatch.setattr(peer_candidates, "sdpa_candidate", lambda backend: harness_candidates.Candidate(peer_candidates.sdpa_name(backend), None, {}))
    ps = next(s for s in peers.plan(["standard"], experiment_module, CONFIG, TARGET, NUM_SMS, directions=("fwd",))
              if s.step.problem.num_heads != s.step.problem.num_heads_kv and s.step.problem.problem_class.regime == "prefill")
    pick = ps.autotune["autotune_own"][0]
    picks = {name: {"picked": pick, "candidates": len(ps.autotune[name]), "seconds": 1.5, "how": "test"} for name in ps.autotune}
    fake = types.SimpleNamespace(_fa4tune_recorder=None, flash_attn_func=None)
    key = (ps.step.problem.label, "fwd")
    candidates, details = peers.step_candidates(ps, 2, experiment_module, picks, {key: ("flash", "")}, fake)
    assert [c.name for c in candidates] == ["upstream", "table", "autotune_own", "pr2634", "pr2634_unpacked", "fa2"]
    assert details["autotune_ours"].endswith("not handed over: " + ", ".join(f"{n} {w}" for w, n in ps.handover.items()))
    assert "the same pick as autotune_own: timed once" in details["autotune_ours"]
    results = {c.name: ProblemResult(ps.step.problem.label, "fwd", "ok", ms_median=1.0) for c in candidates}
    done = peers.complete_results(ps, results, picks, {})
    assert done["autotune_ours"] is done["autotune_own"]
    failed = peers.complete_results(ps, dict(results), {"autotune_own": picks["autotune_own"]}, {"autotune_ours": "RuntimeError: x"})
    assert failed["autotune_ours"].status == "crash" and failed["autotune_ours"].reason == "autotune: RuntimeError: x"
    # a backward step: #2771 through our class, with the table's forward
    bwd = next(s for s in peers.plan(["standard"], experiment_module, CONFIG, TARGET, NUM_SMS, directions=("bwd",))
               if s.pr2771.config is not None)
    made.clear()
    candidates, details = peers.step_candidates(bwd, 1, experiment_module, {}, {}, fake)
    assert [c.name for c in candidates] == ["table", "upstream", "pr2634", "pr2771"]
    assert made[-1] == ("pr2771", bwd.step.table[0], bwd.pr2771.config) and details["pr2771"].startswith(bwd.pr2771.config.short())


# ---- the summary ----

def _record(problem, direction, regime, candidate, ms, status="ok", run=1, reason="", detail=""):
    return {"suite": "s", "problem": problem, "direction": direction, "regime": regime, "class": "c", "run": run,
            "candidate": candidate, "status": status, "ms_median": ms, "reason": reason, "detail": detail}


def _records():
    return [
        # a prefill: 1.2x upstream, 0.9x #2634 (below 0.98), 1.1x FA2; the autotuner not run
        *[_record("a", "fwd", "prefill", c, ms) for c, ms in (("table", 1.0), ("upstream", 1.2), ("pr2634", 0.9), ("fa2", 1.1))],
        _record("a", "fwd", "prefill", "autotune_own", None, status="not_run", reason="autotune does not support softcap"),
        # a chunked prefill (a prefill), two runs: means 1.0 vs 1.03 and 0.99
        *[_record("b", "fwd", "chunked", c, ms, run=r) for r, pair in ((1, (1.0, 1.03)), (2, (1.0, 1.03)))
          for c, ms in zip(("table", "upstream"), pair)],
        _record("b", "fwd", "chunked", "pr2634", 0.99),
        _record("b", "fwd", "chunked", "pr2634", 1.01, run=2),
        # a decode
        *[_record("d", "fwd", "decode", c, ms) for c, ms in (("table", 0.1), ("upstream", 1.0), ("pr2634_decode", 0.2))],
        # a backward: #2634 fails its gate, #2771 cannot be expressed, FA2 0.95x
        *[_record("e", "bwd", "prefill", c, ms) for c, ms in (("table", 2.0), ("upstream", 2.4), ("fa2", 1.9))],
        _record("e", "bwd", "prefill", "pr2634", None, status="incorrect", reason="dq off"),
        _record("e", "bwd", "prefill", "pr2771", None, status="not_run", reason="cannot express: V in registers"),
        # a problem whose table failed: no speedups
        *[_record("f", "bwd", "prefill", c, ms) for c, ms in (("upstream", 2.0), ("fa2", 2.0))],
        _record("f", "bwd", "prefill", "table", None, status="crash", reason="boom"),
    ]


def test_summary_geomeans_counts_and_the_problems_below_each_peer():
    s = peers.summarize(_records())
    g = s["groups"]
    assert set(g) == {("upstream", "prefill"), ("pr2634", "prefill"), ("fa2", "prefill"), ("upstream", "decode"),
                      ("pr2634_decode", "decode"), ("upstream", "bwd"), ("fa2", "bwd")}
    assert g[("upstream", "prefill")]["geomean"] == pytest.approx((1.2 * 1.03) ** 0.5)
    assert g[("pr2634", "prefill")] == {"problems": 2, "geomean": pytest.approx((0.9 * 1.0) ** 0.5), "at_least": 1,
                                        "below": [("a fwd", pytest.approx(0.9))]}  # b: (0.99 + 1.01) / 2 = 1.0, not below
    assert g[("pr2634_decode", "decode")]["geomean"] == pytest.approx(2.0) and g[("upstream", "decode")]["geomean"] == pytest.approx(10.0)
    assert g[("fa2", "bwd")] == {"problems": 1, "geomean": pytest.approx(0.95), "at_least": 0, "below": [("e bwd", pytest.approx(0.95))]}
    assert g[("upstream", "bwd")]["problems"] == 1  # f's table failed: no speedup there
    assert s["below"] == [("a fwd", "pr2634", pytest.approx(0.9)), ("e bwd", "fa2", pytest.approx(0.95))]
    assert ("e bwd", "pr2634", "run 1: incorrect: dq off") in s["failures"] and ("f bwd", "table", "run 1: crash: boom") in s["failures"]
    rows = {(r["problem"], r["direction"]): r for r in s["rows"]}
    assert rows[("e", "bwd")]["not_run"] == {"pr2771": "cannot express: V in registers"}
    assert rows[("f", "bwd")]["speedup"] == {}


def test_the_printed_summary_and_summarize_from_a_file(tmp_path, capsys):
    peers.print_summary(peers.summarize(_records()), "synthetic")
    text = capsys.readouterr().out
    assert "s               a                                    fwd  table 1.0000 ms | upstream 1.200x | pr2634 0.900x | fa2 1.100x" in text
    assert "e                                    bwd pr2771: not run: cannot express: V in registers" in text
    assert "pr2634 prefill: geomean 0.949x over 2 problems; the table >= pr2634 on 1/2; below 0.98x: a fwd 0.900x" in text
    assert "below 0.98x of a peer: a fwd vs pr2634 0.900x; e bwd vs fa2 0.950x" in text
    path = tmp_path / "run.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in _records()) + '\n{"suite": "s", "prob')  # a torn last line
    done = subprocess.run([sys.executable, "bench/peers.py", "--summarize", str(path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "fa2 bwd: geomean 0.950x over 1 problems; the table >= fa2 on 0/1; below 0.98x: e bwd 0.950x" in done.stdout


# ---- sm_120a compiles of the peers' kernels ----

@pytest.mark.compile
@pytest.mark.skipif(not (ROOT / ".peers").is_dir(), reason="needs .peers/ (python3 bench/peer_sources.py assemble --git <clone>)")
def test_the_peers_kernels_compile_for_sm_120a(tmp_path):
    """#2634's dispatch (forward: its TMA class at 128x64; backward), its decode kernel and an autotuner candidate of
    upstream's, each compiled for sm_120a with fake tensors on one shape, as the bench compiles them ahead."""
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "peers_probe.py"), str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert [out[k]["status"] for k in ("dispatch_fwd", "dispatch_bwd", "autotune")] == ["ok"] * 3
    assert out["dispatch_fwd"]["kernels"] == ["tma 128x64 kv_stages=2 num_mma_warps=4"]
    assert out["dispatch_fwd"]["keys"] and set(out["dispatch_fwd"]["keys"].values()) == {"tma 128x64 kv_stages=2 num_mma_warps=4"}
    assert out["decode"]["built"] == "decode n64 num_threads=128 num_splits=4"
    assert out["decode"]["registers"] > 0 and out["decode"]["spill_store_bytes"] == 0


def test_resume_leaves_out_the_steps_a_cut_off_call_measured(experiment_module, tmp_path):
    steps = peers.plan(["quick"], experiment_module, CONFIG, TARGET, NUM_SMS, peers=())
    first = steps[0].step
    out = tmp_path / "out.jsonl"
    out.write_text(json.dumps({"suite": first.suite, "problem": first.problem.label, "direction": first.direction, "run": 1,
                               "candidate": "table"}) + "\n" + json.dumps({"suite": steps[1].step.suite, "problem": steps[1].step.problem.label,
                                                                          "direction": steps[1].step.direction, "run": 1, "candidate": "fa2"}) + "\n")
    assert peers.left_to_run(steps, out, runs=1) == steps[1:]  # a peer's record alone does not make a step done
    assert peers.left_to_run(steps, out, runs=2) == steps


def test_the_gpu_script_spreads_the_named_steps_over_several_gpus_one_queue_each(tmp_path):
    """GPUS=0,1 (a host of several GPUs): each step runs once, on one GPU, in its queue's order, its compiles on the
    host's share of cores; summary is refused in that mode (it reads every step's records)."""
    stub = tmp_path / "bin"
    stub.mkdir()
    calls = tmp_path / "calls.txt"
    for name in ("python3", "nvidia-smi"):
        (stub / name).write_text(f'#!/bin/sh\necho "$CUDA_VISIBLE_DEVICES {name} $*" >> {calls}\n')
        (stub / name).chmod(0o755)
    script = ROOT / "docs" / "measurements" / "data" / "2026-12-07-gpu-peers.sh"
    env = {"PATH": f"{stub}:/usr/bin:/bin", "OUT": str(tmp_path / "out"), "GPUS": "0,1"}
    done = subprocess.run(["bash", str(script), "std-fwd-1", "std-fwd-2", "std-bwd"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    steps = [line.split() for line in calls.read_text().splitlines() if "bench/peers.py" in line]
    jobs = str(max(1, (len(os.sched_getaffinity(0)) // 2) - 1))
    by_step = {s[s.index("--out") + 1].rsplit("peers-", 1)[1]: (s[0], s[s.index("--compile-jobs") + 1]) for s in steps}
    assert by_step == {"std-fwd-1.jsonl": ("0", jobs), "std-fwd-2.jsonl": ("1", jobs), "std-bwd.jsonl": ("0", jobs)}
    assert [s[s.index("--out") + 1].rsplit("-", 1)[1] for s in steps if s[0] == "0"] == ["1.jsonl", "bwd.jsonl"]
    refused = subprocess.run(["bash", str(script), "std-bwd", "summary"], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 2 and "summary after the steps" in refused.stderr
