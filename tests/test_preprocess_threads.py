"""The backward preprocess's thread count: its rules, experiment.py's table, and the count reaching the kernel and
its compile key (a real sm_120a compile in a subprocess)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import experiment
from fa4tune.config import BackwardConfig, ConfigError, ProblemClass
from fa4tune.feasibility import check_preprocess_threads

ROOT = Path(__file__).resolve().parent.parent


def test_the_rules_name_the_preprocess_kernels_own_conditions():
    d64, d96 = ProblemClass(64, 64, False), ProblemClass(96, 96, False)
    assert check_preprocess_threads(256, BackwardConfig(), d64)
    v = check_preprocess_threads(96, BackwardConfig(), d64)
    assert v.rule == "preprocess_threads_domain" and "got 96" in v.message
    v = check_preprocess_threads(64, BackwardConfig(m_block_size=128, AtomLayoutMSdP=4), d64)
    assert v.rule == "preprocess_threads_rows" and "m_block_size (128)" in v.message
    # 32 rows x head_dim 96 / 4 = 768 copies: 512 threads do not divide them
    v = check_preprocess_threads(512, BackwardConfig(m_block_size=32), d96)
    assert v.rule == "preprocess_threads_dQaccum" and "768" in v.message
    v = check_preprocess_threads(512, BackwardConfig(), d96)  # compiles, but measured wrong on the H200
    assert v.rule == "preprocess_threads_head_dim_96"
    assert check_preprocess_threads(512, BackwardConfig(), ProblemClass(128, 128, False))


def test_experiment_takes_its_table_then_the_fallback_then_256_and_refuses_a_count_the_kernel_cannot_run(monkeypatch):
    pc = ProblemClass(128, 128, True)
    assert experiment.preprocess_threads(pc, BackwardConfig()) == 256
    monkeypatch.setitem(experiment.BACKWARD_PREPROCESS_THREADS, pc.name, 128)
    assert experiment.preprocess_threads(pc, BackwardConfig()) == 128
    chunked = ProblemClass(128, 128, True, regime="chunked")
    assert experiment.preprocess_threads(chunked, BackwardConfig()) == 128  # its prefill class's (fa4tune.fallback)
    monkeypatch.setitem(experiment.BACKWARD_PREPROCESS_THREADS, pc.name, 32)
    with pytest.raises(ConfigError, match="preprocess_threads"):
        experiment.preprocess_threads(pc, BackwardConfig())


def test_the_count_reaches_the_preprocess_kernel_and_its_compile_key(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "preprocess_probe.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("PROBE ")), None)
    assert line, done.stderr[-3000:]
    # two compiles (128, then 256), the third call found 128's kernel under its key
    assert json.loads(line[len("PROBE "):])["built"] == [128, 256]
