"""The run configuration's schema: `RunConfig` and the models it is built from (one policy's in
`policy.py`, how a run trains in `train.py`, the pieces they share in `fields.py`).

Every model forbids unknown keys, so a typo is an error rather than a silently
ignored setting, and is frozen once validated, so equal settings are equal
(hashable) values that can key a cache of compiled steps. Numbers are coerced
laxly because YAML 1.1 reads `1e-6` as a string; a string that is not a
number is still an error. Checks that involve several fields raise through
`fields.raise_problems`, which keeps each problem's own key for the loader's messages.
"""

from __future__ import annotations

import functools
import importlib
from pathlib import Path
from typing import Annotated, Any, Union

from pydantic import (
    Discriminator,
    Field,
    SerializeAsAny,
    Tag,
    TypeAdapter,
    WrapValidator,
    field_validator,
    model_validator,
)

from marljax.sampler.schedule import Buckets, SamplingParams, Schedule
from marljax.tasks import SOURCES, Source
from marljax.train.config.fields import (
    TEMPLATE_FIELDS,
    FrozenModel,
    format_problem,
    name_problem,
    raise_problems,
)
from marljax.train.config.policy import (
    BufferConfig,
    LoraConfig,
    LossConfig,
    MeshConfig,
    OptimizerConfig,
    PolicyConfig,
    PolicyModelConfig,
)
from marljax.train.config.train import DynamicSamplingConfig, SandboxPoolConfig, TrainConfig, WandbConfig
from marljax.train.distributed import DistributedConfig
from marljax.workflows import REGISTRY, BaseWorkflowConfig
from marljax.workflows.base import resolve_alias
from marljax.workflows.grpo import GrpoConfig

__all__ = [
    "AgentConfig",
    "BufferConfig",
    "DataConfig",
    "DynamicSamplingConfig",
    "FrozenModel",
    "GrpoConfig",
    "LoraConfig",
    "LossConfig",
    "MeshConfig",
    "PolicyModelConfig",
    "OptimizerConfig",
    "PolicyConfig",
    "RunConfig",
    "SamplerConfig",
    "SamplingConfig",
    "SandboxPoolConfig",
    "TrainConfig",
    "WandbConfig",
    "WorkflowConfig",
]


class SamplingConfig(FrozenModel):
    """Sampling settings that override the run's `sampler` block; an unset key keeps its value."""

    temperature: float | None = Field(None, ge=0, description="0 = greedy")
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0, description="0 disables")
    max_new_tokens: int | None = Field(None, ge=1)
    stop: tuple[str, ...] | None = Field(None, description="stop strings (the completion keeps them)")

    def over(self, sampler: SamplerConfig) -> SamplerConfig:
        """`sampler` with the keys set here replaced."""
        return sampler.model_copy(update=self.model_dump(exclude_none=True))


class AgentConfig(FrozenModel):
    policy: str = Field(description="name of the policy in `policies` this agent samples from and trains")
    role: str = Field("", description="role text substituted for {role}")
    template: str = Field("{role}{problem}", description="prompt; placeholders " + ", ".join(TEMPLATE_FIELDS))
    sampling: SamplingConfig | None = Field(
        None, description="this agent's sampling, over the run's `sampler`"
    )
    eval_sampling: SamplingConfig | None = Field(
        None,
        description="this agent's sampling for evaluation, over `sampling` and the run's `eval_sampling`",
    )

    @field_validator("template")
    @classmethod
    def _template(cls, v):
        if (why := format_problem(v, TEMPLATE_FIELDS)) is not None:
            raise ValueError(why)
        return v


# A data block of the form before `source` existed, and what to write instead.
OLD_DATA_KEYS = ("train", "eval", "schema", "synthetic", "grid", "tools")


def _old_data_form(v: dict) -> str | None:
    old = [k for k in OLD_DATA_KEYS if k in v]
    if not old:
        return None
    generated = [k for k in ("synthetic", "grid", "tools") if k in v]
    if generated:
        kind, inside = generated[0], f"the keys of `{generated[0]}` inside"
    else:
        kind = "qa" if v.get("schema") == "qa" else "jsonl"
        inside = ", ".join(f"`{k}`" for k in old if not (kind == "qa" and k == "schema")) + " inside"
    return f"old form ({', '.join(old)}); write `source: {{kind: {kind}, ...}}` with {inside}"


def _data_source(v: Any, handler: Any) -> Source:
    """The registered source class that `kind` names validates the mapping (looked up now, so a
    source registered after this module was imported is known)."""
    del handler  # the annotation is the base class; the registry picks the subclass
    if isinstance(v, Source):
        return v
    if not isinstance(v, dict):
        raise ValueError(f"expected a mapping with a `kind` (one of {', '.join(SOURCES.names())})")
    if v.get("kind") not in SOURCES.names():
        what = "missing required key" if "kind" not in v else "unknown data source"
        raise_problems([(("kind",), f"{what}; known: {', '.join(SOURCES.names())}", v.get("kind"))])
    return SOURCES.get(v["kind"]).model_validate(v)


class DataConfig(FrozenModel):
    """Where problems come from (`source`, a registered `marljax.tasks` source) and how the
    training split is streamed (the other keys)."""

    source: Annotated[Any, WrapValidator(_data_source)] = Field(
        description="where problems come from: a mapping whose `kind` names a registered source "
        "(marljax.tasks: jsonl, qa, synthetic, grid, tools) and holds its settings",
    )
    batch_size: int = Field(4, ge=1, description="problems per step")
    shuffle: bool = True
    seed: int = Field(0, description="the stream's shuffle seed (a generated source has its own)")
    epochs: int | None = Field(None, ge=1, description="None repeats forever")

    @model_validator(mode="before")
    @classmethod
    def _old_form(cls, v):
        if isinstance(v, dict) and (why := _old_data_form(v)) is not None:
            raise_problems([((), why, {k: v[k] for k in OLD_DATA_KEYS if k in v})])
        return v


class SamplerConfig(FrozenModel):
    max_new_tokens: int = Field(128, ge=1)
    temperature: float = Field(1.0, ge=0, description="0 = greedy")
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0, description="0 disables")
    max_prompt_len: int = Field(512, ge=1)
    min_prompt_bucket: int = Field(
        16, ge=1, description="smallest padded prompt length; larger = fewer compiles"
    )
    min_batch_bucket: int = Field(1, ge=1, description="smallest padded batch; larger = fewer compiles")
    slots: int = Field(
        64, ge=1, description="rows decoding at once (the KV cache's size); more requests queue for a slot"
    )
    share_prefixes: bool = Field(
        True, description="requests sharing a prompt prefix (samples, tree nodes) prefill it once"
    )
    shrink: bool | None = Field(
        None,
        description="fit each call's decode batch to its rows (fewer slots for fewer requests, and "
        "fewer as rows finish): less work per step where a step costs about in proportion to its "
        "rows (a CPU), one compiled program per slot count; off, every call decodes `slots` rows "
        "(an accelerator's step of few rows costs about what a full one does). Default: on for a "
        "CPU, off for GPU and TPU",
    )
    windows: bool = Field(
        True,
        description="a decode step reads only the cache positions its rows have reached, in windows "
        "of 64, 96, 128, 192, ... positions (one compiled program per set of windows a call grows "
        "through); off, every step reads the call's whole cache (one program per slot count): "
        "fewer compiles where a run's calls start at many different lengths (multi-turn, tools)",
    )
    stop: tuple[str, ...] = Field((), description="stop strings (the completion keeps them)")

    def schedule(self, platform: str) -> Schedule:
        """How a call's requests share the decode slots on a backend `platform` (cpu, gpu, tpu)."""
        shrink = platform == "cpu" if self.shrink is None else self.shrink
        return Schedule(slots=self.slots, share_prefixes=self.share_prefixes, shrink=shrink)

    def buckets(self) -> Buckets:
        """The sampler's shape buckets."""
        return Buckets(
            min_prompt=self.min_prompt_bucket,
            min_batch=self.min_batch_bucket,
            min_window=Buckets.min_window if self.windows else None,
        )

    def sampling(self) -> SamplingParams:
        """The settings of each sampled prompt, as the sampler takes them."""
        return SamplingParams(self.max_new_tokens, self.temperature, self.top_p, self.top_k, self.stop)


def workflow_kinds() -> tuple[str, ...]:
    """The registered workflow kinds (`marljax.workflows.REGISTRY`), the default first; read when a
    config is validated, so that a workflow module imported after this one (outside the package)
    can be named in YAML."""
    return tuple(REGISTRY)


@functools.cache
def _workflow_union(kinds: tuple[str, ...]) -> TypeAdapter:
    # Workflow option models live beside their workflows; `kind` picks one, a mapping without
    # `kind` means the default workflow, as the field default does.
    models = [REGISTRY[k][0] for k in kinds]
    return TypeAdapter(
        Annotated[
            Union[tuple(Annotated[m, Tag(k)] for m, k in zip(models, kinds))],  # noqa: UP007 (no `|` form for a tuple)
            Discriminator(
                lambda v: v.get("kind", kinds[0]) if isinstance(v, dict) else getattr(v, "kind", None)
            ),
        ]
    )


def _validate_workflow(value: Any, handler: Any) -> BaseWorkflowConfig:
    del handler  # the registry's union validates instead of the declared base class
    module = value.get("module") if isinstance(value, dict) else None
    if module:
        try:
            importlib.import_module(module)  # registers its workflow kinds
        except ImportError as e:
            raise ValueError(f"module {module!r} (workflow.module) cannot be imported: {e}") from e
    value = resolve_alias(value)  # an old kind (e.g. sharp_tools) read as the kind it became
    return _workflow_union(workflow_kinds()).validate_python(value)


# serialised as the concrete workflow config it holds, not as the base class
WorkflowConfig = Annotated[SerializeAsAny[BaseWorkflowConfig], WrapValidator(_validate_workflow)]


class RunConfig(FrozenModel):
    name: str = "run"
    run_dir: str = Field("runs/{name}", description="output directory; {name} is replaced by name")
    seed: int = 0
    policies: dict[str, PolicyConfig] = Field(min_length=1)
    agents: dict[str, AgentConfig] = Field(min_length=1)
    data: DataConfig
    sampler: SamplerConfig = Field(default_factory=SamplerConfig)
    eval_sampling: SamplingConfig = Field(
        default_factory=lambda: SamplingConfig(temperature=0.0),
        description="evaluation's sampling over the run's `sampler` and each agent's `sampling` (default greedy)",
    )
    workflow: WorkflowConfig = Field(default_factory=GrpoConfig)
    sandbox: SandboxPoolConfig = Field(default_factory=SandboxPoolConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)

    @field_validator("name")
    @classmethod
    def _name(cls, v):
        if (why := name_problem(v)) is not None:
            raise ValueError(why)
        return v

    @field_validator("run_dir")
    @classmethod
    def _run_dir(cls, v):
        if (why := format_problem(v, ("name",))) is not None:
            raise ValueError(why)
        return v

    @field_validator("policies", "agents")
    @classmethod
    def _names(cls, v):
        raise_problems([((k,), why, k) for k in v if (why := name_problem(k)) is not None])
        return v

    @model_validator(mode="after")
    def _references(self):
        found = []
        known = ", ".join(self.policies)
        for name, policy in self.policies.items():
            if policy.base is None:
                continue
            base = self.policies.get(policy.base)
            if base is None:
                found.append(
                    (
                        ("policies", name, "base"),
                        f"unknown policy {policy.base!r}; known: {known}",
                        policy.base,
                    )
                )
            elif base.model is None:
                found.append(
                    (
                        ("policies", name, "base"),
                        f"policy {policy.base!r} has no model of its own (it has a base)",
                        policy.base,
                    )
                )
        for name, agent in self.agents.items():
            if agent.policy not in self.policies:
                found.append(
                    (
                        ("agents", name, "policy"),
                        f"unknown policy {agent.policy!r}; known: {known}",
                        agent.policy,
                    )
                )
        found += [
            (("workflow", *key), msg, value) for key, msg, value in self.workflow.check_agents(self.agents)
        ]
        raise_problems(found)
        return self

    def policy_model(self, name: str) -> PolicyModelConfig:
        """The model a policy loads: its own, or (adapter policies) its base policy's."""
        policy = self.policies[name]
        return policy.model if policy.model is not None else self.policies[policy.base].model

    def agent_sampling(self, name: str, *, evaluation: bool = False) -> SamplerConfig:
        """An agent's sampling settings: the run's `sampler` with the agent's `sampling` over it;
        for evaluation, then the run's `eval_sampling` and the agent's `eval_sampling`."""
        agent = self.agents[name]
        layers = [agent.sampling]
        if evaluation:
            layers += [self.eval_sampling, agent.eval_sampling]
        out = self.sampler
        for layer in layers:
            if layer is not None:
                out = layer.over(out)
        return out

    def resolved_run_dir(self) -> Path:
        return Path(self.run_dir.format(name=self.name))
