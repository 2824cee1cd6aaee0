"""SFT targets longer than an agent's sampling budget are named in a warning before SFT starts:
RL would cut every such completion (issue 41)."""

from __future__ import annotations

import logging
import types
from pathlib import Path

from marljax.train.config import load_config
from marljax.train.sft import warn_cut_targets

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


class CharTurns:
    """One token per character: lengths are easy to count by hand."""

    @staticmethod
    def encode_completion(text: str) -> list[int]:
        return [ord(c) for c in text]


def trainer_with_budget(max_new_tokens: int):
    cfg = load_config(CONFIGS / "grpo_tiny.yaml", [f"sampler.max_new_tokens={max_new_tokens}"])
    policies = {name: types.SimpleNamespace(turns=CharTurns()) for name in cfg.policies}
    agents = {
        name: types.SimpleNamespace(name=name, policy=agent.policy) for name, agent in cfg.agents.items()
    }
    return types.SimpleNamespace(cfg=cfg, policies=policies, agents=agents)


def test_targets_over_the_budget_are_counted_and_named(caplog):
    problems = ["x" * 10, "x" * 20, "x" * 30]  # every agent's targets: 10, 20 and 30 tokens
    trainer = trainer_with_budget(20)
    agents = len(trainer.agents)
    with caplog.at_level(logging.WARNING, logger="marljax.train.sft"):
        # the 30-token target, once per agent
        assert warn_cut_targets(trainer, dict.fromkeys(trainer.agents, problems)) == agents
    assert "1 of 3 reference targets" in caplog.text and "max_new_tokens=20" in caplog.text
    assert "the longest 30 tokens" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="marljax.train.sft"):
        assert warn_cut_targets(trainer_with_budget(30), dict.fromkeys(trainer.agents, problems)) == 0
    assert not caplog.text
