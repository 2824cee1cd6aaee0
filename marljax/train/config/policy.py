"""What one policy is in the run configuration: its model (checkpoint or preset), optimiser, loss,
buffer, mesh and LoRA adapter (`PolicyConfig`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from marljax.kernels.losses import AGG_MODES, LOSS_TYPES
from marljax.kernels.losses_terms import KL_KINDS
from marljax.kernels.losses_tis import TIS_LEVELS, TIS_MODES
from marljax.models.config import PRESETS, REMAT_POLICIES
from marljax.models.lora import TARGETS, LoraSpec
from marljax.train.config.fields import FrozenModel, raise_problems


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
            raise_problems(
                [((), "set exactly one of path, preset", {"path": self.path, "preset": self.preset})]
            )
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
            raise_problems([(("decay_steps",), "schedule 'cosine' needs decay_steps", None)])
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
            raise_problems(
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
            raise_problems(found)
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
            raise_problems(
                [(("model",), "set exactly one of model, base", {"model": self.model, "base": self.base})]
            )
        if self.base is not None and self.lora is None:
            raise_problems(
                [(("lora",), "base needs lora (a policy on another policy's base is an adapter)", None)]
            )
        return self

    @model_validator(mode="after")
    def _kl_needs_reference(self):
        if self.loss.kl_coef > 0 and not self.reference:
            raise_problems(
                [
                    (
                        ("reference",),
                        f"loss.kl_coef = {self.loss.kl_coef} needs reference: true",
                        self.reference,
                    )
                ]
            )
        return self
