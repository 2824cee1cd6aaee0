"""`SamplerView`: a policy's weights in the sampler's layout, and its sampling calls.

The sampler may use another layout than the trainer (`sampler_mesh`, e.g. data x tensor, which
needs no all-gathers per decoded token). Parameters then go to the sampler's layout on device
(`marljax.models.sharding.reshard`), once per parameter change. On a multi-process run every
process samples its own prompts on its own devices from a per-process copy of the parameters
(all-gathered on device).

The sampler reads the model's weights in the compute dtype (`ModelConfig.dtype`): with float32
master weights and bfloat16 compute, a bfloat16 copy is made once per parameter change (before any
move to another layout, so per-process copies are bfloat16 too), not cast in every decode step,
which would read the float32 weights each step. The model maths casts every weight to the compute
dtype where it uses it, so the copy changes no token and no log-prob.

Adapter policies on one base keep one copy of the base in the sampler's layout (`BaseStore`) and
sample together: their adapters are stacked once per change of the team or of an adapter
(`marljax.models.lora.stack_adapters`), each prompt's rows decoding with their own adapter.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from marljax.models.chat import TurnFormat
from marljax.models.config import ModelConfig
from marljax.models.decoder import param_dict_shardings
from marljax.models.lora import LoraSpec, stack_adapters
from marljax.models.sharding import mesh_platform, process_local_mesh, reshard, to_local
from marljax.sampler import generate
from marljax.sampler.schedule import SamplingParams
from marljax.train.config import SamplerConfig
from marljax.train.learner import combine


def needs_cast(params: dict, config: ModelConfig) -> bool:
    """Whether some floating weight of `params` is stored in another dtype than the compute dtype."""
    dtype = jnp.dtype(config.dtype)
    return any(jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dtype for x in jax.tree.leaves(params))


@functools.partial(jax.jit, static_argnums=1)
def in_compute_dtype(params: dict, dtype: str) -> dict:
    """`params` with every floating leaf in `dtype` (elementwise: each keeps its sharding)."""
    return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, params)


class SamplerView:
    """One policy's weights as its sampler sees them. `trainable()` gives the policy's current
    trainable parameters (the whole model, or an adapter); `frozen` the frozen base of an adapter
    policy (None otherwise), shared through `bases` (a `BaseStore`). `sampler_mesh`: the sampler's
    mesh (the trainer's unless the policy names its own, `own_sampler_mesh`)."""

    def __init__(
        self,
        config: ModelConfig,
        turns: TurnFormat,
        *,
        trainable: Callable[[], dict],
        frozen: dict | None,
        lora: LoraSpec | None,
        sampler_mesh: Mesh | None,
        own_sampler_mesh: bool,
        bases: Any,
    ):
        self.config, self.turns, self.lora, self.frozen = config, turns, lora, frozen
        self._trainable, self._bases = trainable, bases
        self._cache = self._team_cache = None
        self.mesh, self._to_sampler = sampler_mesh, None
        if jax.process_count() > 1:
            staging, self.mesh = process_local_mesh(sampler_mesh)
            local = self.mesh
            self._to_sampler = lambda tree, specs: to_local(
                tree, local_specs=specs, staging=staging, local=local
            )
        elif own_sampler_mesh:

            def move(tree, specs):
                if sampler_mesh is None:  # a one-device sampler
                    return jax.device_put(tree, jax.devices()[0])
                shardings = jax.tree.map(
                    lambda s: NamedSharding(sampler_mesh, s),
                    specs,
                    is_leaf=lambda x: isinstance(x, PartitionSpec),
                )
                return reshard(tree, shardings)

            self._to_sampler = move

    @property
    def own_copy(self) -> bool:
        """Whether the sampler reads its own copy of the weights (another layout, or per process)."""
        return self._to_sampler is not None

    @property
    def base_key(self) -> int | None:
        """Adapter policies with equal keys share one base (and can sample in one call)."""
        return None if self.frozen is None else id(self.frozen)

    def forget(self) -> None:
        """Drop the copies made for the sampler (before the policy's state is replaced)."""
        self._cache = self._team_cache = None

    def _model_specs(self) -> dict:
        """Partition specs of the model's parameters (an adapter policy: its base's) on the sampler's mesh."""
        if self.mesh is None:
            return jax.tree.map(
                lambda _: PartitionSpec(), self._trainable() if self.frozen is None else self.frozen
            )
        return jax.tree.map(lambda s: s.spec, param_dict_shardings(self.config, self.mesh))

    def own(self) -> dict:
        """The trainable parameters in the sampler's layout, made once per parameter change: the
        whole model in the compute dtype, or the adapter as it is (replicated; `stack_adapters`
        scales it in its own dtype, so a cast here would round differently)."""
        params = self._trainable()
        whole = self.frozen is None
        if self._to_sampler is None and not (whole and needs_cast(params, self.config)):
            return params
        if self._cache is None or self._cache[0] is not params:
            copy = in_compute_dtype(params, self.config.dtype) if whole else params
            if self._to_sampler is not None:
                specs = self._model_specs() if whole else jax.tree.map(lambda _: PartitionSpec(), params)
                copy = self._to_sampler(copy, specs)
            self._cache = (params, copy)
        return self._cache[1]

    def base(self) -> dict | None:
        """An adapter policy's frozen base in the sampler's layout and compute dtype: one copy per
        base and sampler mesh, shared by the adapters on it."""
        if self.frozen is None or (self._to_sampler is None and not needs_cast(self.frozen, self.config)):
            return self.frozen

        def make(base):
            copy = in_compute_dtype(base, self.config.dtype)
            return copy if self._to_sampler is None else self._to_sampler(copy, self._model_specs())

        return self._bases.sampler_copy(self.frozen, self.mesh, make)

    def params(self) -> dict:
        """The model parameters in the sampler's layout (an adapter policy: its base with its adapter)."""
        return combine(self.own(), self.base(), lora=self.lora)

    def sync(self) -> None:
        """Multi-process runs: make the sampler's per-process copy of the current parameters now.
        Making it is a collective (an all-gather over the processes): made lazily by `generate`,
        it would hang as soon as one process samples this policy and another does not, so the
        trainer calls this on every process at the same points."""
        if jax.process_count() > 1 and self._to_sampler is not None:
            self.params()

    def _stacked(self, team: Sequence[SamplerView]) -> dict:
        """The team's adapters stacked for one sampling call, rebuilt only when the team or one of
        its adapters changed since the last call (a rollout samples the same team many times
        between updates)."""
        own = [v.own() for v in team]
        cached = self._team_cache
        if (
            cached is None
            or len(cached[0]) != len(team)
            or any(a is not b for a, b in zip(cached[0], team))
            or any(a is not b for a, b in zip(cached[1], own))
        ):
            cached = self._team_cache = (
                list(team),
                own,
                stack_adapters([(v.lora, o) for v, o in zip(team, own)]),
            )
        return cached[2]

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        *,
        n: int,
        seed: int,
        sampler: SamplerConfig,
        sampling: SamplingParams | Sequence[SamplingParams] | None = None,
        team: Sequence[SamplerView] | None = None,
        adapter: int | Sequence[int] = 0,
    ):
        """`SamplerOutput` for `n` samples of each prompt (log-probs at the sampling temperature).

        `sampler`: the run's `SamplerConfig` (slots and buckets); `sampling`: one `SamplingParams`
        or one per prompt (default the `sampler`'s; the stop strings are the first prompt's, one
        set per call). `team`: the views of adapter policies on this policy's base (itself
        included) sampled in one call, prompt `i` with adapter `team[adapter[i]]`.
        """
        sampling = sampler.sampling() if sampling is None else sampling
        if team is None:
            params = self.params()
        elif self.frozen is None or any(v.base_key != self.base_key or v.mesh != self.mesh for v in team):
            raise ValueError("a team samples together only as adapter policies on one base and sampler mesh")
        else:
            params = {**self.base(), "lora": self._stacked(team)}
        first = sampling if isinstance(sampling, SamplingParams) else sampling[0]
        stop = [self.turns.tokenizer.encode(text, add_special_tokens=False) for text in first.stop]
        return generate(
            self.config,
            prompt_ids,
            sampling,
            params=params,
            n=n,
            seed=seed,
            stop=[s for s in stop if s],
            eos_ids=self.turns.eos_ids,
            pad_id=self.turns.pad_id,
            mesh=self.mesh,
            buckets=sampler.buckets(),
            schedule=sampler.schedule(mesh_platform(self.mesh)),
            adapter=adapter,
        )
