"""Multi-agent interaction patterns: problems in, scored samples with credit out.

Workflows drive a `Generator` (real policies through the sampler, or scripted
text in tests) and the rewards; they know nothing about optimisers.
"""

from typing import Any

from marljax.workflows.base import (Agent, Generation, Generator, PolicyGenerator, Rollout, ScriptedGenerator,
                                    WorkflowSettings)
from marljax.workflows.at_grpo import AtGrpoConfig, AtGrpoWorkflow
from marljax.workflows.dr_mas import DrMasConfig, DrMasWorkflow
from marljax.workflows.grpo import GrpoConfig, GrpoWorkflow
from marljax.workflows.magrpo import MagrpoConfig, MagrpoWorkflow
from marljax.workflows.mars2 import Mars2Config, Mars2Workflow
from marljax.workflows.sharp import SharpConfig, SharpWorkflow
from marljax.workflows.types import ID_FIELDS, Sample

# kind -> (typed options, workflow class with `from_config(options)`); the run config's
# `workflow` section is validated against these option models.
REGISTRY: dict[str, tuple[type[WorkflowSettings], Any]] = {
    "grpo": (GrpoConfig, GrpoWorkflow),
    "magrpo": (MagrpoConfig, MagrpoWorkflow),
    "mars2": (Mars2Config, Mars2Workflow),
    "at_grpo": (AtGrpoConfig, AtGrpoWorkflow),
    "dr_mas": (DrMasConfig, DrMasWorkflow),
    "sharp": (SharpConfig, SharpWorkflow),
}


def build_workflow(cfg: Any):
    """The workflow for a config's `workflow` section (dispatch on `kind`)."""
    if cfg.kind not in REGISTRY:
        raise ValueError(f"unknown workflow kind {cfg.kind!r}; known: {sorted(REGISTRY)}")
    return REGISTRY[cfg.kind][1].from_config(cfg)


__all__ = ["Agent", "Generation", "Generator", "ID_FIELDS", "PolicyGenerator", "REGISTRY", "Rollout", "Sample",
           "ScriptedGenerator", "WorkflowSettings", "build_workflow"]
