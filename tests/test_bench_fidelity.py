"""bench/fidelity.py: the emulation-fidelity rule (a kernel compiled for the emulating GPU's arch against its sm_120a
compile), the facts gathered ahead in two compiler pools with sm_120a's cached, and one real sm_120a compile."""

from __future__ import annotations

import pytest

from bench import fidelity
from fa4tune import defaults
from fa4tune.config import Problem, ProblemClass
from search_helpers import ROOT, TARGET

EXPERIMENT = ROOT / "experiment.py"


def facts(arch: str, registers: int, spill_bytes: int, ctas: int = 1) -> dict:
    return {"arch": arch, "registers": registers, "spill_bytes": spill_bytes, "ctas_per_sm": ctas}


def test_upstreams_d192_backward_is_flagged_and_the_suites_ordinary_differences_are_not():
    """The issue's case (compiled 2026-12-07, CPU): sm_90a 32 registers and 15424 + 15076 B of spill traffic, sm_120a
    255 registers and 720 + 744 B; the differences the standard and generalization suites' kernels show between the
    two arches stay inside the margins."""
    d192 = fidelity.disagreement(facts("sm_120a", 255, 1464), facts("sm_90a", 32, 30500))
    assert d192.startswith("spills differ by more than 512 B: sm_120a 255 regs, 1464 B spilled")
    assert "sm_90a 32 regs, 30500 B spilled" in d192
    for sm120a, run in (((255, 0), (220, 0)),  # the d128 chunked TMA entry: 35 registers apart
                        ((255, 352), (255, 92)),  # both spilling, 260 B apart
                        ((255, 48), (235, 0)),  # a few spills on one arch only
                        ((255, 0), (255, 0))):
        assert fidelity.disagreement(facts("sm_120a", *sm120a), facts("sm_90a", *run)) == ""
    assert fidelity.disagreement(facts("sm_120a", 255, 720), facts("sm_90a", 255, 0)).startswith("one spills, the other not")
    assert fidelity.disagreement(facts("sm_120a", 200, 0), facts("sm_90a", 150, 0)).startswith("registers differ by more than 48")
    # 2 registers apart, but SM120 holds another number of CTAs with the emulating compile's registers
    assert fidelity.disagreement(facts("sm_120a", 130, 0, 3), facts("sm_90a", 128, 0, 4)).startswith(
        "the registers give SM120 another number of CTAs per SM")


def test_ctas_per_sm_are_sm120s_for_the_kernels_threads_registers_and_shared_memory():
    reply = {"status": "ok", "arch": "sm_90a", "kernel": {"registers": 128, "spill_store_bytes": 8, "spill_load_bytes": 4,
                                                         "static_smem_bytes": 0, "dynamic_smem_bytes": 16384}}
    assert fidelity.kernel_facts(reply, "sm_90a", TARGET, 128) == facts("sm_90a", 128, 12, 4)  # 64K registers / (128 x 128)
    assert fidelity.kernel_facts({**reply, "kernel": {**reply["kernel"], "dynamic_smem_bytes": 65536}}, "sm_90a", TARGET, 128)["ctas_per_sm"] == 1
    failed = fidelity.kernel_facts({"status": "compile_error", "reason": "boom", "arch": "sm_120a"}, "sm_120a", TARGET, 128)
    assert failed == {"arch": "sm_120a", "error": "compile_error: boom"}


def test_a_candidate_is_flagged_compared_or_left_unchecked_and_a_native_run_never_flagged():
    one = facts("sm_120a", 255, 0)
    assert fidelity.candidate_fidelity({"sm120a": one, "run": one})["unchecked"] == fidelity.NATIVE  # one compile on SM120
    flagged = fidelity.candidate_fidelity({"sm120a": facts("sm_120a", 255, 1464), "run": facts("sm_90a", 32, 30500)})
    assert flagged["flag"].startswith("spills differ") and flagged["unchecked"] == ""
    missing = fidelity.candidate_fidelity({"sm120a": one, "run": {"arch": "sm_90a", "error": "compile_error: x"}})
    assert missing["flag"] == "" and missing["unchecked"].startswith("no facts: sm_120a 255 regs")
    assert fidelity.candidate_fidelity(None)["unchecked"].startswith("not compiled ahead")
    row = {"table": fidelity.candidate_fidelity({"sm120a": one, "run": facts("sm_90a", 250, 0)}), "upstream": flagged, "fa2": None}
    assert fidelity.row_flag(row) == f"upstream: {flagged['flag']}" and fidelity.row_unchecked(row) == ""
    assert fidelity.row_unchecked({"table": missing}).startswith("table: no facts")


class FakePool:
    """A CompilePool stand-in: answers each job with registers by the arch its environment names."""

    made: list = []

    def __init__(self, function, jobs, env):
        self.function, self.jobs, self.env, self.sent = function, jobs, env, []
        FakePool.made.append(self)

    def submit(self, job):
        from concurrent.futures import Future

        self.sent.append(job)
        arch = self.env["CUTE_DSL_ARCH"]
        regs = 32 if arch == "sm_90a" and job["kind"] == "bwd" else 255
        spill = (15424, 15076) if regs == 32 else (720, 744)
        future = Future()
        future.set_result({"status": "ok", "arch": arch, "kernel": {
            "registers": regs, "stack_bytes": 0, "spill_store_bytes": spill[0], "spill_load_bytes": spill[1], "static_smem_bytes": 0,
            "dynamic_smem_bytes": 99328, "declared_smem_bytes": 99328, "compile_seconds": 1.0}})
        return future

    def close(self):
        pass


def test_gather_compiles_each_class_kernel_once_for_both_arches_and_caches_sm120a(tmp_path):
    first, second = (Problem(b, 4096, 4096, 16, 16, 192, 128, True, name=f"p{b}") for b in (2, 1))
    pc = first.problem_class
    bwd, fwd = defaults.upstream_backward(pc), defaults.upstream_forward(pc)
    pairs = [("bwd", bwd, first), ("bwd", bwd, second), ("fwd", fwd, first), ("fwd", fwd, second)]
    jobs = fidelity.jobs_of(pairs)
    assert jobs == [("bwd", bwd, first), ("fwd", fwd, first)]  # a class's kernel once, on its first problem's shape
    cache, gpu_env = tmp_path / "facts.jsonl", {"CUTE_DSL_ARCH": "sm_90a", "FA4TUNE_KERNEL_CACHE": str(tmp_path / "k")}
    FakePool.made = []
    found = fidelity.gather(jobs, TARGET, EXPERIMENT, 4, "sm_90a", gpu_env, cache, FakePool, log=lambda line: None)
    gpu_pool, sm_pool = FakePool.made
    assert gpu_pool.env == gpu_env and sm_pool.env["CUTE_DSL_ARCH"] == "sm_120a" and sm_pool.env["CUDA_VISIBLE_DEVICES"] == ""
    assert gpu_pool.jobs + sm_pool.jobs == 4 and gpu_pool.function == sm_pool.function == fidelity.COMPILE_FUNCTION
    assert [j["problem"]["name"] for j in gpu_pool.sent] == ["p2", "p2"]
    key = fidelity.facts_key("bwd", bwd, second.problem_class)  # every problem of the class finds it
    assert found[key] == {"sm120a": facts("sm_120a", 255, 1464), "run": facts("sm_90a", 32, 30500)}
    assert fidelity.candidate_fidelity(found[key])["flag"].startswith("spills differ")
    assert fidelity.candidate_fidelity(found[fidelity.facts_key("fwd", fwd, pc)])["flag"] == ""
    # again: sm_120a's from the cache, only the GPU's arch compiles (its kernel cache serves it there)
    FakePool.made = []
    again = fidelity.gather(jobs, TARGET, EXPERIMENT, 4, "sm_90a", gpu_env, cache, FakePool, log=lambda line: None)
    assert [p.env["CUTE_DSL_ARCH"] for p in FakePool.made] == ["sm_90a"] and FakePool.made[0].jobs == 4
    assert again == found
    # on an SM120 GPU one compile is both
    FakePool.made = []
    native = fidelity.gather(jobs, TARGET, EXPERIMENT, 4, "sm_120a", {"CUTE_DSL_ARCH": "sm_120a"}, None, FakePool, log=lambda line: None)
    assert len(FakePool.made) == 1 and native[key]["sm120a"] is native[key]["run"]
    assert (fidelity.candidate_fidelity(native[key])["flag"], fidelity.candidate_fidelity(native[key])["unchecked"]) == ("", fidelity.NATIVE)
    # the CPU's run ahead: sm_120a alone
    FakePool.made = []
    alone = fidelity.gather(jobs, TARGET, EXPERIMENT, 1, None, None, tmp_path / "other.jsonl", FakePool, log=lambda line: None)
    assert [p.env["CUTE_DSL_ARCH"] for p in FakePool.made] == ["sm_120a"] and alone[key]["run"] is None


@pytest.mark.compile
def test_a_real_sm120a_compile_gives_upstreams_d128_causal_forward_its_known_facts_and_a_second_gather_reads_the_cache(tmp_path):
    """Upstream's default d128 causal forward: 255 registers and spills on sm_120a (tests/test_static_check.py holds the
    same kernel's facts from the static check), here through the fidelity compile of a problem's own shape."""
    pc = ProblemClass(128, 128, True)
    config = defaults.upstream_forward(pc)
    job = ("fwd", config, Problem(1, 1024, 1024, 2, 2, 128, 128, True, backward=False))
    cache = tmp_path / "facts.jsonl"
    found = fidelity.gather([job], TARGET, EXPERIMENT, 1, None, None, cache, log=lambda line: None)
    sm120a = found[fidelity.facts_key("fwd", config, pc)]["sm120a"]
    assert sm120a["arch"] == "sm_120a" and sm120a["registers"] == 255 and sm120a["spill_bytes"] > 0, sm120a
    assert sm120a["ctas_per_sm"] == 1  # 64 KB of shared memory

    def no_pool(*args):
        raise AssertionError("the cached facts need no compile")

    assert fidelity.gather([job], TARGET, EXPERIMENT, 1, None, None, cache, no_pool, log=lambda line: None) == found
    emulated = fidelity.candidate_fidelity({"sm120a": sm120a, "run": facts("sm_90a", 32, sm120a["spill_bytes"] + 4096)})
    assert emulated["flag"].startswith("spills differ by more than 512 B: sm_120a 255 regs")


def test_a_kernel_stored_without_facts_is_compiled_again_for_them(monkeypatch):
    """`search run` under emulation stores its GPU-arch kernels without reading their cubins: the fidelity compile
    that loads such a kernel compiles it once more, the cache loading nothing meanwhile, and keeps the entry."""
    import fa4tune.fake_compile as fake_compile
    from fa4tune.kernel_cache import DiskCompileCache

    class Cache(DiskCompileCache):
        def __init__(self):
            dict.__init__(self)

        def _load(self, key):
            return True

    cache = Cache()
    loads_seen = []

    def compile_shapes(experiment, kind, config, shapes, read_facts=True):
        loads_seen.append(cache._load("key"))
        if loads_seen[-1]:
            return fake_compile.KernelFacts(kernels_loaded=1, shapes=1, cubin_error=fidelity.NO_STORED_FACTS + " for it")
        return fake_compile.KernelFacts(registers=32, spill_store_bytes=8, spill_load_bytes=8, kernels_compiled=1, shapes=1)

    monkeypatch.setattr(fake_compile, "compile_shapes", compile_shapes)
    monkeypatch.setattr(fidelity, "kernel_cache_of", lambda experiment, kind, config: cache)
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    job = {"kind": "bwd", "config": defaults.upstream_backward(ProblemClass(64, 64, False)).to_dict(),
           "problem": Problem(1, 256, 256, 2, 2, 64, 64, False).to_dict(), "experiment_path": str(EXPERIMENT)}
    reply = fidelity.compile_facts(job)
    assert loads_seen == [True, False] and cache._load("key") is True  # loading is back once the facts are read
    assert reply["status"] == "ok" and reply["arch"] == "sm_90a" and reply["kernel"]["registers"] == 32
