"""The old tool kinds (`sharp_tools`, `dr_mas_search`, `at_grpo_tools`) still load from YAML, as the
kinds they became with `tools:`: each old section reads as the shipped config's new one."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from marljax.train.config import config_from_dict

CONFIGS = Path(__file__).parents[2] / "configs"
BECAME = {"sharp_tools": "sharp", "dr_mas_search": "dr_mas", "at_grpo_tools": "at_grpo"}
OLD = {
    "sharp_tools": {
        "kind": "sharp_tools",
        "planner": "planner",
        "workers": ["worker1", "worker2"],
        "group_size": 4,
        "credit": "counterfactual",
        "tools": {"task": "qa", "max_turns": 2, "max_observation_chars": 120},
    },
    "dr_mas_search": {
        "kind": "dr_mas_search",
        "router": "router",
        "searcher": "searcher",
        "answerer": "answerer",
        "group_size": 4,
        "max_rounds": 3,
        "tools": {"task": "qa", "max_turns": 2, "max_observation_chars": 120},
    },
    "at_grpo_tools": {
        "kind": "at_grpo_tools",
        "tool_agent": "tool_agent",
        "plan_agent": "plan_agent",
        "num_candidates": 4,
        "num_turns": 2,
        "tools": {"task": "plan", "multi_turn": "per_turn", "max_observation_chars": 120},
    },
}


@pytest.mark.parametrize("name", sorted(OLD))
def test_old_kind_reads_as_the_shipped_config(name):
    raw = yaml.safe_load((CONFIGS / f"{name}_tiny.yaml").read_text())
    new = config_from_dict(raw, source=name).workflow
    old = config_from_dict({**raw, "workflow": OLD[name]}, source=name).workflow
    assert old == new and new.kind == BECAME[name] and new.tools is not None
