"""The run configuration's schema: `RunConfig` and the models it is built from.

Every model forbids unknown keys, so a typo is an error rather than a silently
ignored setting, and is frozen once validated, so equal settings are equal
(hashable) values that can key a cache of compiled steps. Numbers are coerced
laxly because YAML 1.1 reads `1e-6` as a string; a string that is not a
number is still an error. Checks that involve several fields raise through
`_problems`, which keeps each problem's own key for the loader's messages.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
import string
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import (
    ConfigDict,
    Discriminator,
    Field,
    SerializeAsAny,
    Tag,
    TypeAdapter,
    WrapValidator,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from marljax.kernels.losses import AGG_MODES, LOSS_TYPES
from marljax.kernels.losses_terms import KL_KINDS
from marljax.kernels.losses_tis import TIS_LEVELS, TIS_MODES
from marljax.models.config import PRESETS, REMAT_POLICIES
from marljax.models.lora import TARGETS, LoraSpec
from marljax.sampler.schedule import SamplingParams
from marljax.settings import StrictModel
from marljax.tasks import SOURCES, Source
from marljax.train.distributed import DistributedConfig
from marljax.train.dynamic_sampling import KEEP_RULES, WHEN_NONE
from marljax.train.metrics import SINKS
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

# Policy and agent names become directory names, so keep them path-safe.
NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")
TEMPLATE_FIELDS = ("role", "problem", "feedback", "history")


def _problems(found: list[tuple[tuple, str, Any]]) -> None:
    """Raise the cross-field problems `(sub-key, message, value)` of one model together.

    The sub-keys travel in the error context so that `config_from_dict` can
    name the exact field instead of the enclosing model.
    """
    if found:
        summary = "; ".join(f"{'.'.join(map(str, k)) or '<model>'}: {m}" for k, m, _ in found)
        raise PydanticCustomError("config", "{summary}", {"summary": summary, "problems": found})


def _check_name(name: str) -> str | None:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name) or name in (".", ".."):
        return "name must match [A-Za-z0-9_.-]+ and not be '.' or '..' (it becomes a directory name)"
    return None


def _check_format(template: str, allowed: Sequence[str]) -> str | None:
    """Why `template` is not a `str.format` string over the names `allowed` (None if it is)."""
    try:
        names = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    except ValueError as e:
        return f"malformed format string: {e}"
    bad = sorted(n for n in names if n not in allowed)
    if bad:
        return (
            f"unknown placeholder {', '.join('{' + n + '}' for n in bad)}; "
            f"allowed: {', '.join('{' + n + '}' for n in allowed)}"
        )
    try:  # catches what parse() lets through, e.g. placeholders nested in a format spec
        template.format(**{n: "" for n in allowed})
    except (ValueError, KeyError, IndexError) as e:
        return f"malformed format string: {e}"
    return None


class FrozenModel(StrictModel):
    """A strict model whose fields cannot be reassigned after validation; hashable when its fields are."""

    model_config = ConfigDict(frozen=True)


class PolicyModelConfig(FrozenModel):
    path: str | None = Field(None, description="local Hugging Face checkpoint directory")
    preset: str | None = Field(
        None, description="random-init architecture from marljax.models.config.PRESETS"
    )
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="compute dtype")
    param_dtype: Literal["float32", "bfloat16"] = Field("float32", description="parameter storage dtype")
    tokenizer: str | None = Field(None, description="tokenizer directory; default: path")
    seed: int = Field(0, description="init seed for presets")
    remat: Literal[REMAT_POLICIES] = Field(
        "none",
        description="what each decoder layer keeps for the backward pass: none (everything), full "
        "(its input only), save_qkv_proj, dots (weight matmul outputs), minimal (those and the "
        "attention output); true / false mean full / none",
    )
    attention_impl: Literal["auto", "xla", "cudnn", "splash"] | None = Field(
        "auto",
        description="attention in training and the sampler's one-token steps: auto (default: cudnn "
        "on a GPU for bfloat16/float16, xla elsewhere), xla (XLA's, from a dense mask), cudnn (GPU "
        "fused flash attention), splash (TPU Pallas splash attention)",
    )
    scan_layers: bool = Field(
        True,
        description="run the layers under lax.scan (compiles independent of depth); "
        "false unrolls them: faster steps on CPU, longer compiles",
    )

    @field_validator("remat", mode="before")
    @classmethod
    def _remat_bool(cls, v):
        # configs written before the named policies said `remat: true`
        return {True: "full", False: "none"}.get(v, v) if isinstance(v, bool) else v

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, v):
        if v is not None and v not in PRESETS:
            raise ValueError(f"unknown preset; known: {', '.join(PRESETS)}")
        return v

    @model_validator(mode="after")
    def _one_source(self):
        if (self.path is None) == (self.preset is None):
            _problems([((), "set exactly one of path, preset", {"path": self.path, "preset": self.preset})])
        return self

    @property
    def tokenizer_dir(self) -> str | None:
        return self.tokenizer if self.tokenizer is not None else self.path


class OptimizerConfig(FrozenModel):
    name: Literal["adamw", "adam", "sgd"] = "adamw"
    lr: float = Field(1e-6, gt=0, description="peak learning rate")
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = Field(0.0, ge=0)
    schedule: Literal["constant", "cosine"] = "constant"
    warmup_steps: int = Field(0, ge=0, description="linear warmup from 0 to lr")
    decay_steps: int | None = Field(None, gt=0, description="cosine decay length (required for cosine)")
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="final lr as a fraction of lr (cosine)")
    max_grad_norm: float | None = Field(1.0, gt=0, description="global-norm gradient clipping; None disables")

    @model_validator(mode="after")
    def _cosine_needs_decay(self):
        if self.schedule == "cosine" and self.decay_steps is None:
            _problems([(("decay_steps",), "schedule 'cosine' needs decay_steps", None)])
        return self


class LossConfig(FrozenModel):
    type: Literal[LOSS_TYPES] = Field("ppo", description="policy-loss surrogate")
    clip_low: float = Field(0.2, gt=0, description="ratio clip below 1 - clip_low")
    clip_high: float = Field(0.2, gt=0, description="ratio clip above 1 + clip_high (DAPO clip-higher)")
    dual_clip: float | None = Field(None, gt=1, description="dual-clip constant for negative advantages")
    agg_mode: Literal[AGG_MODES] = Field("token-mean", description="how per-token losses are aggregated")
    norm_constant: float | None = Field(None, description="divisor for seq-mean-token-sum-norm")
    entropy_coef: float = Field(0.0, description="entropy bonus coefficient")
    kl_coef: float = Field(0.0, ge=0, description="KL penalty to the reference model")
    kl_estimator: Literal[KL_KINDS] = "k3"
    tis_cap: float | None = Field(
        None, gt=0, description="truncated importance sampling cap; None disables TIS"
    )
    tis_level: Literal[TIS_LEVELS] = "token"
    tis_mode: Literal[TIS_MODES] = Field(
        "truncate", description="truncate: min(w, tis_cap); mask: w outside [1/tis_cap, tis_cap] becomes 0"
    )
    tis_veto: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="a sequence with any token ratio below this gets weight 0 (verl/MARTI veto)",
    )

    @model_validator(mode="after")
    def _tis_options_need_tis(self):
        if self.tis_cap is None:
            _problems(
                [
                    ((key,), "needs tis_cap (importance sampling is off without it)", value)
                    for key, value, default in (
                        ("tis_mode", self.tis_mode, "truncate"),
                        ("tis_veto", self.tis_veto, None),
                    )
                    if value != default
                ]
            )
        return self

    @property
    def agg_norm_constant(self) -> float | None:
        """`norm_constant` where `agg_mode` divides by it, else None (the kernels refuse it elsewhere)."""
        return self.norm_constant if self.agg_mode == "seq-mean-token-sum-norm" else None

    def policy_loss_options(self) -> dict[str, Any]:
        """The static options of `marljax.kernels.policy_loss` that this config sets."""
        return {
            "loss_type": self.type,
            "clip_low": self.clip_low,
            "clip_high": self.clip_high,
            "dual_clip": self.dual_clip,
            "agg_mode": self.agg_mode,
            "norm_constant": self.agg_norm_constant,
        }


class BufferConfig(FrozenModel):
    threshold: int = Field(8, ge=1, description="samples that trigger an update")
    max_staleness: int | None = Field(
        None, ge=0, description="drop samples older than this many updates; None keeps all"
    )


class DcnMeshConfig(FrozenModel):
    """Mesh axes split across slices (TPU multislice) or processes (elsewhere): the slow network."""

    data: int = Field(1, ge=1, description="slices (or processes) along the data axis")
    fsdp: int = Field(1, ge=1, description="slices (or processes) along the fsdp axis")


class MeshConfig(FrozenModel):
    """A policy's mesh (`marljax.models.sharding.make_mesh`): `data`, `fsdp`, `tensor` devices
    inside a slice, times `dcn` across slices; each axis's size is its ICI size x its DCN size."""

    data: int = Field(1, ge=1)
    fsdp: int = Field(1, ge=1)
    tensor: int = Field(1, ge=1)
    dcn: DcnMeshConfig | None = Field(
        None, description="sizes across slices, e.g. {data: 2}: each slice holds one block of the mesh"
    )
    devices: list[Annotated[int, Field(ge=0)]] | None = Field(
        None, description="device ids for this policy; None = all devices (shared)"
    )

    def axis_sizes(self) -> dict[str, int]:
        """The mesh's size along each axis: ICI x DCN."""
        dcn = self.dcn or DcnMeshConfig()
        return {"data": self.data * dcn.data, "fsdp": self.fsdp * dcn.fsdp, "tensor": self.tensor}

    @model_validator(mode="after")
    def _devices_fill_mesh(self):
        if self.devices is not None:
            found = []
            if len(set(self.devices)) != len(self.devices):
                found.append((("devices",), "device ids repeat", self.devices))
            sizes = self.axis_sizes()
            size = sizes["data"] * sizes["fsdp"] * sizes["tensor"]
            if len(self.devices) != size:
                found.append((("devices",), f"need data*fsdp*tensor (x dcn) = {size} devices", self.devices))
            _problems(found)
        return self


class LoraConfig(FrozenModel):
    """A LoRA adapter on a frozen base (`marljax.models.lora`): only the adapter trains."""

    rank: int = Field(16, ge=1)
    alpha: float = Field(32.0, gt=0, description="the update is scaled by alpha / rank")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapter's inputs (updates only)")
    targets: tuple[Literal[tuple(TARGETS)], ...] = Field(
        tuple(TARGETS), min_length=1, description="projections with an adapter: " + ", ".join(TARGETS)
    )
    seed: int = Field(0, description="init seed of the adapter's A matrices")

    def spec(self) -> LoraSpec:
        return LoraSpec(rank=self.rank, alpha=self.alpha, targets=tuple(self.targets), dropout=self.dropout)


class PolicyConfig(FrozenModel):
    model: PolicyModelConfig | None = Field(
        None, description="the checkpoint or preset (for an adapter policy: its frozen base)"
    )
    base: str | None = Field(
        None,
        description="adapter policies: the name of another policy whose `model` is the frozen base "
        "(instead of `model`); all adapter policies on one base share one copy of its weights",
    )
    lora: LoraConfig | None = Field(
        None, description="train a LoRA adapter on the frozen base instead of all weights"
    )
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    reference: bool = Field(
        False,
        description="keep a frozen copy of the initial model for the KL term "
        "(adapter policies: the base itself, no copy)",
    )
    buffer: BufferConfig = Field(default_factory=BufferConfig)
    micro_batch_size: int = Field(8, ge=1, description="sequences per forward/backward pass")
    mini_batches: int = Field(1, ge=1, description="optimizer steps per update")
    mesh: MeshConfig = Field(default_factory=MeshConfig)
    sampler_mesh: MeshConfig | None = Field(
        None,
        description="sampler layout if not the trainer's; parameters are resharded on device (adapter "
        "policies: their base once per sampler mesh, shared; their adapters per update)",
    )
    chat: Literal["auto", "on", "off"] = Field(
        "auto",
        description="prompts as chat messages through the tokenizer's chat template (auto: when it has one)",
    )

    @field_validator("chat", mode="before")
    @classmethod
    def _yaml_on_off(cls, v):
        return (
            {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v
        )  # YAML reads on/off as bools

    @model_validator(mode="after")
    def _one_model(self):
        if (self.model is None) == (self.base is None):
            _problems(
                [(("model",), "set exactly one of model, base", {"model": self.model, "base": self.base})]
            )
        if self.base is not None and self.lora is None:
            _problems(
                [(("lora",), "base needs lora (a policy on another policy's base is an adapter)", None)]
            )
        return self

    @model_validator(mode="after")
    def _kl_needs_reference(self):
        if self.loss.kl_coef > 0 and not self.reference:
            _problems(
                [
                    (
                        ("reference",),
                        f"loss.kl_coef = {self.loss.kl_coef} needs reference: true",
                        self.reference,
                    )
                ]
            )
        return self


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
        if (why := _check_format(v, TEMPLATE_FIELDS)) is not None:
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
        _problems([(("kind",), f"{what}; known: {', '.join(SOURCES.names())}", v.get("kind"))])
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
            _problems([((), why, {k: v[k] for k in OLD_DATA_KEYS if k in v})])
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
    stop: tuple[str, ...] = Field((), description="stop strings (the completion keeps them)")

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


class SandboxPoolConfig(FrozenModel):
    workers: int | None = Field(None, ge=1, description="parallel test processes; None = CPU count + 1")
    timeout_s: float = Field(5.0, gt=0)
    memory_mb: int = Field(512, ge=1)


class DynamicSamplingConfig(FrozenModel):
    keep: Literal[KEEP_RULES] = Field(
        "accuracy",
        description="which problems teach: accuracy, those whose completions' pass flags vary (DAPO: "
        "std of passed > 0); advantage, those with a completion of non-zero advantage",
    )
    max_rounds: int = Field(3, ge=1, description="rollouts per step at most")
    when_none: Literal[WHEN_NONE] = Field(
        "skip",
        description="when no round has a problem that teaches: skip (train nothing this step) or "
        "train (the first round whole)",
    )


class SftTeacherConfig(FrozenModel):
    """A scripted teacher whose turns SFT imitates: it plays every agent of the run's workflow on the
    train problems, and each agent's (prompt, reply) pairs become its policy's SFT examples, the
    prompts encoded as the policy will see them when it samples the same turns (multi-turn and tool
    workflows, whose later prompts hold earlier turns, included)."""

    script: str = Field(
        description="`module:function` (an installed module, or one on PYTHONPATH), called with "
        "`options` and `seed` (the run's); it returns a `ScriptedGenerator` script "
        "`(agent, prompt, k, seed) -> reply` (e.g. `marljax.demo.tools:teacher`)"
    )
    options: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of `script`")
    rounds: int = Field(
        16, ge=1, description="rollouts of the workflow recorded, each over data.batch_size problems"
    )

    @field_validator("script")
    @classmethod
    def _importable(cls, v):
        module, _, name = v.partition(":")
        if not (module and name):
            raise ValueError(f"expected `module:function`, got {v!r}")
        try:
            found = getattr(importlib.import_module(module), name, None)
        except ImportError as e:
            raise ValueError(f"module {module!r} cannot be imported: {e}") from e
        if not callable(found):
            raise ValueError(f"{module} has no function {name!r}")
        return v

    @model_validator(mode="after")
    def _takes_its_options(self):
        try:
            inspect.signature(self._function()).bind(**self.options, seed=0)
        except TypeError as e:
            _problems([(("options",), f"{self.script} does not take these (and seed): {e}", self.options)])
        return self

    def _function(self):
        module, _, name = self.script.partition(":")
        return getattr(importlib.import_module(module), name)

    def make_script(self, seed: int):
        return self._function()(**self.options, seed=seed)


# keys of `train` that were renamed, and what to write instead (a run record of an older version
# holding them is read through `load.upgrade_record`)
RENAMED_TRAIN_KEYS = {
    "tensorboard": "renamed to train.log_to, a list: `log_to: [tensorboard]` for true, `log_to: []` for false",
    "max_sampling_rounds": "renamed to train.dynamic_sampling.max_rounds: `dynamic_sampling: {max_rounds: N}`",
}


class WandbConfig(FrozenModel):
    """Weights & Biases settings, used when `train.log_to` holds wandb."""

    project: str | None = Field(None, description="None: $WANDB_PROJECT, else marljax")
    entity: str | None = Field(None, description="team or user; None: wandb's default ($WANDB_ENTITY)")
    mode: Literal["online", "offline", "disabled"] | None = Field(
        None,
        description="offline writes the run under RUN_DIR/wandb/ for a later `wandb sync`; None: "
        "$WANDB_MODE, else online",
    )


class TrainConfig(FrozenModel):
    steps: int = Field(100, ge=1)
    save_every: int = Field(10, ge=1)
    keep_checkpoints: int = Field(3, ge=1)
    async_checkpoint: bool = True
    log_every: int = Field(1, ge=1)
    eval_every: int | None = Field(
        None, ge=1, description="evaluate every N steps and once before RL (step 0); None disables evaluation"
    )
    log_to: tuple[Literal[SINKS], ...] = Field(
        ("tensorboard",),
        description="where metrics go besides RUN_DIR/metrics.jsonl: tensorboard (RUN_DIR/tensorboard/), "
        "wandb (Weights & Biases, `pip install 'marljax[wandb]'`; settings in `wandb`)",
    )
    wandb: WandbConfig = Field(default_factory=WandbConfig)
    progress: bool = True
    sft_steps: int = Field(0, ge=0, description="supervised warm-up steps before RL")
    sft_lr: float | None = Field(
        None,
        gt=0,
        description="SFT's peak learning rate (a warm start usually wants a larger one than RL); "
        "None: each policy's optimizer.lr",
    )
    # SFT's optimiser: the policy's, with what these set changed
    sft_warmup_steps: int | None = Field(
        None,
        ge=0,
        description="SFT's linear warm-up to its peak rate; None: the policy's optimizer.warmup_steps",
    )
    sft_schedule: Literal["constant", "cosine"] | None = Field(
        None,
        description="SFT's rate after the warm-up: constant, or cosine decay over sft_steps to "
        "sft_min_lr_ratio of the peak (the warm start is not caught mid-oscillation); None: the policy's",
    )
    sft_min_lr_ratio: float | None = Field(
        None, ge=0, le=1, description="cosine: SFT's final rate as a fraction of its peak; None: the policy's"
    )
    sft_batch_size: int | None = Field(
        None, ge=1, description="SFT examples per policy and step; None: data.batch_size"
    )
    sft_teacher: SftTeacherConfig | None = Field(
        None,
        description="imitate a scripted teacher's turns instead of the problems' reference solutions "
        "(marljax.train.sft)",
    )
    log_rollouts: int = Field(
        0,
        ge=0,
        description="every N steps write each sample's prompt, completion, reward and advantage "
        "to RUN_DIR/rollouts/step_<step>.jsonl (read with `marljax rollouts`); 0 disables",
    )
    dynamic_sampling: DynamicSamplingConfig | None = Field(
        None,
        description="DAPO: train only on problems that teach, rolling out more until data.batch_size "
        "of them are collected (train/dynamic_sampling.py); true: the defaults; null: off",
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, v):
        if isinstance(v, dict):
            _problems([((key,), why, v[key]) for key, why in RENAMED_TRAIN_KEYS.items() if key in v])
        return v

    @field_validator("log_to", mode="before")
    @classmethod
    def _one_sink(cls, v):
        # `log_to: wandb` means the list of that one
        return (v,) if isinstance(v, str) else v

    @field_validator("log_to")
    @classmethod
    def _each_once(cls, v):
        return tuple(dict.fromkeys(v))

    @field_validator("dynamic_sampling", mode="before")
    @classmethod
    def _dynamic_sampling_switch(cls, v):
        # `dynamic_sampling: true` switches it on with its defaults
        return ({} if v else None) if isinstance(v, bool) else v

    agent_grad_norms: bool = Field(
        False,
        description="log agent/<name>/grad_norm: the norm of the gradient of each agent's samples' loss "
        "alone, at each update (a diagnostic for agents sharing a policy; one more forward and "
        "backward pass per agent)",
    )


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
        if (why := _check_name(v)) is not None:
            raise ValueError(why)
        return v

    @field_validator("run_dir")
    @classmethod
    def _run_dir(cls, v):
        if (why := _check_format(v, ("name",))) is not None:
            raise ValueError(why)
        return v

    @field_validator("policies", "agents")
    @classmethod
    def _names(cls, v):
        _problems([((k,), why, k) for k in v if (why := _check_name(k)) is not None])
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
        _problems(found)
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
