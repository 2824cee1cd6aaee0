"""`PolicyState`: what changes as a policy trains, and exactly what its checkpoint holds."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from marljax.train.optim import applied_steps


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PolicyState:
    """A policy's trainable parameters (the whole model, or an adapter on a frozen base), their
    optimiser state, the KL reference (None without one) and `version`, the number of completed RL
    updates (it tags the samples the parameters generate, so the trainer can measure staleness).
    A pytree; the learner's steps return a new one."""

    params: Any
    opt_state: Any
    ref_params: Any = None
    version: int = dataclasses.field(default=0, metadata=dict(static=True))

    @property
    def step(self) -> int:
        """Optimiser steps applied (RL and SFT) since the optimiser state was made; skipped ones do
        not count."""
        return int(applied_steps(self.opt_state))

    def replace(self, **changes) -> PolicyState:
        return dataclasses.replace(self, **changes)

    def checkpoint(self) -> dict:
        """The checkpointed tree; `step` is a copy of the optimiser state's count, for readers."""
        tree = {
            "params": self.params,
            "opt_state": self.opt_state,
            "step": np.asarray(self.step, np.int64),
            "version": np.asarray(self.version, np.int64),
        }
        if self.ref_params is not None:
            tree["ref_params"] = self.ref_params
        return tree

    def restore_target(self) -> dict:
        """`checkpoint()` as shapes, dtypes and shardings: what a restore fills in. (Not
        `jax.eval_shape`: it drops the arrays' placement and turns the int64 counters into int32.)"""

        def abstract(x):
            if isinstance(x, jax.Array):
                return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
            return x

        return jax.tree.map(abstract, self.checkpoint())

    @classmethod
    def from_checkpoint(cls, tree: dict) -> PolicyState:
        return cls(tree["params"], tree["opt_state"], tree.get("ref_params"), int(tree["version"]))
