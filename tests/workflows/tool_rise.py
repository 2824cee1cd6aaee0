"""The warm-started rise check the `test_tool_rise_*` files share: after SFT on a sloppy teacher
(`marljax.demo.tools.warm_started_run`) a short RL run raises the team's reward above the first
steps' level by more than the run-to-run spread measured across seeds (benchmarks/RESULTS.md), and
the logged rollouts show the tool calls and what the tools answered. One file per workflow: xdist
hands whole files to a worker, so the runs of several minutes each go to different workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from marljax.train import rollout_log

# what a tool result looks like in each workflow's logged rollouts
RESULT = {"dr_mas_search": "[search] [1]", "sharp_tools": "[search] [1]", "at_grpo_tools": "[check_plan]"}


def warm_started_records(kind: str, out, seed: int, rl_steps: int) -> list[dict]:
    """`warm_started_run` in a child process compiled at XLA's default optimisation level: this
    run is execution-bound, and the test suite's level-0 compiles (tests/conftest.py) double it."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    code = (
        "import json, sys; from pathlib import Path; from marljax.demo.tools import warm_started_run; "
        "r = warm_started_run(sys.argv[1], Path(sys.argv[2]), seed=int(sys.argv[3]), rl_steps=int(sys.argv[4])); "
        "Path(sys.argv[2], 'records.json').write_text(json.dumps(r))"
    )
    subprocess.run(
        [sys.executable, "-c", code, kind, str(out), str(seed), str(rl_steps)],
        env=env,
        check=True,
        timeout=1200,
    )
    return json.loads((out / "records.json").read_text())


def check_rise(kind: str, out, *, seed: int, steps: int, window: int, margin: float) -> None:
    """The team reward's mean over the last `window` RL steps exceeds the first `window` steps' by
    `margin`, and the rollouts logged every 5 steps hold tool calls and tool results."""
    records = warm_started_records(kind, out, seed=seed, rl_steps=steps)
    reward = np.array([r["team/reward"] for r in records])
    assert len(reward) == steps
    first, last = reward[:window].mean(), reward[-window:].mean()
    assert first < 1.0 - margin, reward  # the warm start leaves room to rise
    assert last - first > margin, reward
    logged = [r for s in range(5, steps + 1, 5) for r in rollout_log.read_step(out / "run", s)]
    text = "\n".join(r["prompt"] + r["completion"] for r in logged)
    assert "<tool_call>" in text and RESULT[kind] in text
