"""The benchmark harness (`benchmarks/run.py`) runs end to end in smoke mode and reports sane numbers.

Smoke mode uses tiny shapes and no external environments (tunix, verl); about 45 s of CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from script_loader import load_script

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow(seconds=45)
def test_harness_smoke(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--smoke", "--out", str(tmp_path)],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "results.json").read_text())
    res = report["results"]
    assert set(res) == {"peak", "train", "generate", "kernels", "rl", "sandbox"}
    for name, sec in res.items():
        assert "error" not in sec, f"{name}: {sec.get('error')}"
        load = report["section_load"][name]
        assert load["wall_s"] > 0 and isinstance(load["noisy"], bool)

    assert all(v > 1e8 for v in res["peak"]["peak_flops"].values())  # > 0.1 GFLOP/s, float32 and bfloat16
    (train,) = res["train"]["rows"]
    assert train["marljax"]["tokens_per_s"] > 0 and train["transformers"]["tokens_per_s"] > 0
    assert train["marljax_scan"]["tokens_per_s"] > 0  # the same step with the layers under lax.scan
    assert train["entropy_rel_diff"] < 1e-3  # same weights, same batch: same model
    assert 0 < train["marljax"]["fraction_of_peak"] < 1.5
    gen = res["generate"]["rows"]
    assert {r["mode"] for r in gen} == {"greedy", "top_p=0.9"}
    assert all(r["marljax"] > 0 and r["transformers"] > 0 for r in gen)
    assert [r["greedy_tokens_equal"] for r in gen if r["mode"] == "greedy"] == ["1.000 / -"]
    tail = {r["engine"]: r for r in res["generate"]["longtail"]["rows"]}
    assert set(tail) >= {"static", "static, slot-sized calls", "continuous", "transformers generate"}
    # lockstep pays for every slot until the longest row ends; continuous refills slots
    assert tail["continuous"]["slot_steps_per_token"] < tail["static"]["slot_steps_per_token"]
    k = res["kernels"]
    assert k["marljax"]["tokens_per_s"] > 0 and k["numpy"]["tokens_per_s"] > 0
    assert k["max_rel_diff_vs_numpy"]["marljax"] < 1e-4
    rl = res["rl"]["breakdown"]["grpo_tiny"]
    assert rl["seconds_per_step"] > 0 and abs(sum(rl["share"].values()) - 1) < 1e-6
    assert rl["seconds"]["sampling"] > 0 and rl["seconds"]["update"] > 0
    assert rl["end_of_run_seconds"] > 0  # close() waits for the last checkpoint: reported once, not per step
    assert res["sandbox"]["pool_programs_per_s"] > 0
    md = (tmp_path / "results.md").read_text()
    assert "## Targets (issues #9 and #4)" in md and "Load average when the harness started" in md


def test_targets_table():
    run = load_script(ROOT / "benchmarks" / "run.py", "marljax_benchmarks_run")
    results = {
        "kernels": {"speedup_vs_verl": 5.0, "speedup_vs_verl_vectorized": 2.0},
        "train": {"rows": [{"size": "tiny", "speedup": 2.5}]},
        "rl": {"breakdown": {"grpo_tiny": {"outside_sampling_and_update": 0.3}}},
    }
    status = {t["target"]: t["status"] for t in run.targets(results)}
    assert status["kernels vs verl (GRPO loop estimator) >= 3x"] == "met"
    assert status["kernels vs verl (vectorised GRPO) >= 3x"] == "NOT met"
    assert status["train step tiny vs transformers >= 2x"] == "met"
    assert status["train step 50M vs transformers >= 1.2x"] == "not measured"
    assert status["RL iteration (grpo_tiny): <= 10% outside sampling and updates"] == "NOT met"


@pytest.mark.parametrize("size", ["tiny", "qwen2.5-0.5b"])
def test_transformers_side_builds_every_size(monkeypatch, size):
    """The train benchmark's transformers model for each size (the GPU size too, whose real shape
    names special tokens): the same shape as marljax's side, no special tokens."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import bench_train

    cfg = bench_train.hf_config(size)
    keys = bench_train.SIZES[size][1]
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size) == (
        keys["hidden_size"],
        keys["num_hidden_layers"],
        keys["vocab_size"],
    )
    assert cfg.bos_token_id is None and cfg.eos_token_id is None and cfg.pad_token_id == 0


@pytest.mark.slow(seconds=50)
def test_mfu_benchmark_smoke(tmp_path):
    """`bench_mfu.py --smoke`: the trainer's update at a tiny shape, with sane MFU and FLOP counts.

    Tolerance of the FLOP cross-check: XLA's count (layers unrolled) is at least the model FLOPs with
    full T x T attention (what the XLA path computes) and, without remat, at most 30% more (the loss's
    and optimiser's elementwise work; at this 64-wide model with a 512-word vocabulary it is ~16%);
    remat "full" runs the layers' forward again, so its count is larger still."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "mfu.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_mfu.py"), "--smoke", "--out", str(out)],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["peak_bf16_flops"] > 1e8 and "| smoke | xla | none |" in res["markdown"]
    cases = {c["remat"]: c for c in res["cases"]}
    assert set(cases) == {"none", "full"}
    for c in cases.values():
        assert "error" not in c, c.get("error")
        assert c["tokens"] == 2 * 64 and c["step_s"] > 0 and c["compile_s"] > 0
        assert c["tokens_per_s"] == pytest.approx(c["tokens"] / c["step_s"])
        assert 0 < c["mfu"] < 1, c["mfu"]
        assert c["mfu"] == pytest.approx(c["model_flops"] / c["step_s"] / res["peak_bf16_flops"])
        assert c["model_flops"] < c["model_flops_full_attention"] <= c["xla_flops"]
        assert c["memory"]["temp_bytes"] > 0 and c["loss"] == c["loss"]  # finite loss, not NaN
    assert cases["none"]["xla_flops"] <= 1.3 * cases["none"]["model_flops_full_attention"]
    assert cases["full"]["xla_flops"] > 1.1 * cases["none"]["xla_flops"]  # the recomputed forward
