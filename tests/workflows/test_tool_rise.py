"""Warm-started tool teams improve under RL: after SFT on a sloppy teacher (marljax.demo.tools) a
short RL run raises the team's reward above the first steps' level by more than the run-to-run
spread measured across seeds (benchmarks/RESULTS.md); the logged rollouts show the tool calls and
what the tools answered."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from marljax.demo.tools import teacher
from marljax.train import rollout_log
from marljax.workflows.base import Agent

# workflow -> (RL steps, first/last window, margin). dr_mas_search (benchmarks/RESULTS.md, 2026-11-26,
# warm_started_run's defaults): rises +0.46, +0.31, +0.19 at seeds 0, 1, 2 (std 0.11); the margin is
# above that spread and below every seed's rise. sharp_tools and at_grpo_tools: no rise shown yet
# (RESULTS.md), so no test of theirs here.
RISES = {"dr_mas_search": (20, 4, 0.15)}
# what a tool result looks like in each workflow's logged rollouts
RESULT = {"dr_mas_search": "[search] [1]", "sharp_tools": "[search] [1]", "at_grpo_tools": "[check_plan]"}


def test_teachers_slip_at_their_rate():
    """The teacher's answer agent copies the city instead of the country about half the time."""
    script = teacher("dr_mas_search", 0.5, seed=3)
    prompt = (
        "In which country was Kalo Mira born?\n\nNotes:\n[search] [1] Kalo Mira: Kalo Mira was born in Vo.\n"
        "[search] [1] Vo: Vo is a city in Belten."
    )
    answers = [script(Agent("answerer", "p"), prompt, 0, 0) for _ in range(400)]
    assert set(answers) == {"<answer>Belten</answer>", "<answer>Vo</answer>"}
    assert 0.4 < answers.count("<answer>Vo</answer>") / 400 < 0.6
    assert teacher("dr_mas_search", 0.0)(Agent("answerer", "p"), prompt, 0, 0) == "<answer>Belten</answer>"


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


@pytest.mark.slow(seconds=360)
@pytest.mark.parametrize("kind", sorted(RISES))
def test_warm_started_team_reward_rises(kind, tmp_path):
    steps, window, margin = RISES[kind]
    records = warm_started_records(kind, tmp_path, seed=0, rl_steps=steps)
    reward = np.array([r["team/reward"] for r in records])
    assert len(reward) == steps
    first, last = reward[:window].mean(), reward[-window:].mean()
    assert first < 1.0 - margin, reward  # the warm start leaves room to rise
    assert last - first > margin, reward
    logged = [r for s in range(5, steps + 1, 5) for r in rollout_log.read_step(tmp_path / "run", s)]
    text = "\n".join(r["prompt"] + r["completion"] for r in logged)
    assert "<tool_call>" in text and RESULT[kind] in text


def test_demonstrations_encode_later_turns_as_the_policy_will_sample_them(tmp_path):
    """A worker's second turn continues its first: SFT must see the first turn's tokens ending with
    the end-of-turn token, as the policy's own sampled turn will end (not the script's bytes)."""
    import yaml

    from marljax.demo.tools import CONFIGS, demonstrations, write_model
    from marljax.train.config import config_from_dict
    from marljax.train.loop import Trainer

    raw = yaml.safe_load((CONFIGS / "sharp_tools_tiny.yaml").read_text())
    raw.update(run_dir=str(tmp_path / "run"))
    texts = [
        t
        for ps in demonstrations(config_from_dict(raw), teacher("sharp_tools", 0.3), 2).values()
        for p in ps
        for t in p
    ]
    model = write_model(tmp_path / "model", texts)
    raw["policies"]["shared"]["model"] = {"path": str(model)}
    raw["policies"]["shared"]["chat"] = "off"
    cfg = config_from_dict(raw)
    trainer = Trainer(cfg)
    try:
        policy = trainer.policies["shared"]
        pairs = demonstrations(cfg, teacher("sharp_tools", 0.3), 2, policies=trainer.policies)["worker2"]
        earlier = {str(p) + r: (p, r) for p, r in pairs}
        later = [(p, r) for p, r in pairs if "Observation:" in p]
        assert later
        tok, eos = policy.tokenizer, policy.eos_ids[0]
        for p, _ in later:
            head = next(k for k in earlier if str(p).startswith(k))
            p0, r0 = earlier[head]
            expected = [
                *tok(str(p0), add_special_tokens=False)["input_ids"],
                *tok(r0, add_special_tokens=False)["input_ids"],
                eos,
                *tok(str(p)[len(head) :], add_special_tokens=False)["input_ids"],
            ]
            assert policy.encode_prompt(p) == expected
    finally:
        trainer.close()
