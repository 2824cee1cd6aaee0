"""Multi-agent interaction patterns: problems in, scored samples with credit out.

Workflows drive a `Generator` (real policies through the sampler, or scripted
text in tests) and the rewards; they know nothing about optimisers.
"""

from typing import Any

from marljax.workflows.base import Agent, Generation, Generator, PolicyGenerator, Rollout, ScriptedGenerator
from marljax.workflows.grpo import GrpoWorkflow
from marljax.workflows.types import ID_FIELDS, Sample

WORKFLOWS = {"grpo": GrpoWorkflow}


def build_workflow(cfg: Any):
    """The workflow for a config's `workflow` section (dispatch on `kind`)."""
    if cfg.kind not in WORKFLOWS:
        raise ValueError(f"unknown workflow kind {cfg.kind!r}; known: {sorted(WORKFLOWS)}")
    return WORKFLOWS[cfg.kind].from_config(cfg)


__all__ = ["Agent", "Generation", "Generator", "ID_FIELDS", "PolicyGenerator", "Rollout", "Sample",
           "ScriptedGenerator", "WORKFLOWS", "build_workflow"]
