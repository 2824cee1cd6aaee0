"""Multi-agent interaction patterns: problems in, a `Rollout` of scored, credited completions out.

Workflows drive a `Generator` (real policies through the sampler, or scripted
text in tests) and a `Verifier`; they know nothing about optimisers. Every
module of this package is imported here, so a workflow module registers
itself (`@register_workflow`); the run config's `workflow.kind` is validated
against `REGISTRY`, whose first kind (grpo) is the default.
"""

import importlib
import pkgutil

from marljax.workflows import grpo  # noqa: F401  registered first: the default kind
from marljax.workflows.base import (
    REGISTRY,
    Agent,
    BaseWorkflowConfig,
    Generator,
    ScriptedGenerator,
    Workflow,
    build_workflow,
    register_workflow,
)
from marljax.workflows.episodes import Episodes
from marljax.workflows.types import ID_FIELDS, Generation, Rollout, Rows

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "ID_FIELDS",
    "REGISTRY",
    "Agent",
    "Episodes",
    "Generation",
    "Generator",
    "Rollout",
    "Rows",
    "ScriptedGenerator",
    "Workflow",
    "BaseWorkflowConfig",
    "build_workflow",
    "register_workflow",
]
