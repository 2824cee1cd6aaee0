"""The agent-sharing benchmark (`benchmarks/bench_lora.py`) runs in smoke mode and reports what the
three levels should show: level 2 keeps one copy of the model like level 1, level 3 one per agent."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_bench_lora_smoke(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    sys.modules.pop("bench_lora", None)
    import bench_lora

    out = bench_lora.run("smoke")
    rows = {r["level"]: r for r in out["rows"]}
    assert set(rows) == {1, 2, 3} and all(r["team"] == 2 and r["fits"] for r in rows.values())
    for r in rows.values():
        assert "error" not in r, r.get("error")
        assert r["peak_rss"] > 0 and r["step_s"] > 0 and r["sample_s"] > 0 and r["update_s"] > 0
    # model weight buffers: one model for the shared policy and for the adapters, two for two copies
    assert rows[2]["model_buffers"] == rows[1]["model_buffers"]
    assert rows[3]["model_buffers"] == 2 * rows[1]["model_buffers"]
    # the estimates order the levels as the issue expects: copies cost the most
    assert rows[2]["estimate"] < rows[3]["estimate"]
    s = out["sampling"]
    assert "error" not in s, s.get("error")
    assert s["adapters"] == 4 and s["one_call_s"] > 0 and s["separate_calls_s"] > 0
    assert "| 2 | 2 (LoRA adapters) |" in out["markdown"]
