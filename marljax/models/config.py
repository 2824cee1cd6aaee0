"""`ModelConfig`: the one typed, validated, hashable description of a decoder.

It is built from a Hugging Face config (`ModelConfig.from_hf`) or from a named
preset (`ModelConfig.preset("tiny-qwen3")`), and turned back into a
transformers config for `save_pretrained` (`ModelConfig.to_hf_config`). What
differs between families (architecture names, fixed switches, refused keys,
presets) is read from their records in `marljax.models.families`.

Being a frozen dataclass, a `ModelConfig` can be a static argument of
`jax.jit`. Anything in a Hugging Face config that changes the maths and that
this package does not implement (sliding windows, YaRN rope, MLP biases,
activations other than SiLU, ...) is refused with an error naming the key.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)
import numpy as np

from marljax.models.families import FAMILIES, by_architecture

# architecture name -> model_type, of the registered families
SUPPORTED_ARCHITECTURES: dict[str, str] = {f.architecture: f.model_type for f in FAMILIES.values()}

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
DTYPES = ("float32", "bfloat16", "float16")
REMAT_POLICIES = ("none", "full", "dots", "save_qkv_proj", "minimal")
ATTENTION_IMPLS = (None, "xla", "cudnn", "splash")  # "auto" is resolved when a config is made


def platform_attention(dtype: str, head_dim: int, platform: str) -> str | None:
    """The attention "auto" stands for: cuDNN's fused flash attention on a GPU where it takes the
    shape (bfloat16 or float16, a head dim that is a multiple of 8 up to 256), XLA's elsewhere.
    cuDNN's kernel reads only each row's own keys, which XLA's dense mask cannot, and agrees with
    it to rounding (benchmarks/RESULTS.md, "Second GPU lease")."""
    if platform == "gpu" and dtype in ("bfloat16", "float16") and head_dim % 8 == 0 and head_dim <= 256:
        return "cudnn"
    return None


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of one decoder plus its runtime choices.

    Architecture fields mirror the Hugging Face names in snake case
    (`num_layers` = `num_hidden_layers`, `num_heads` = `num_attention_heads`,
    `num_kv_heads` = `num_key_value_heads`). Runtime fields:

    - `dtype`: compute dtype of activations ("float32" | "bfloat16" | "float16");
      logits and log-probs are always returned in float32.
    - `param_dtype`: storage dtype of the parameters.
    - `remat`: what each layer keeps for the backward pass (`marljax.models.decoder.REMAT_SAVES`):
      "none" (everything), "full" (only its input; the layer is recomputed), "save_qkv_proj"
      (the q/k/v projections), "dots" (every weight matmul's output), "minimal" (those and the
      attention output: only elementwise work is recomputed).
    - `attention_impl`: training and prefill attention (`marljax.models.attention`): None or
      "xla" (XLA's, from a dense mask), "cudnn" (GPU fused flash attention, causal with per-row
      lengths: rows right-padded), "splash" (TPU Pallas splash attention); "auto" becomes
      `platform_attention`'s choice for the default backend when the config is made.
    - `scan_layers`: run the layers under one `lax.scan` (compile time independent
      of depth) or, when False, as one unrolled block per layer: XLA then keeps
      each layer's activations as they are instead of writing them into stacked
      buffers and slicing them back in the backward pass, which trades longer
      compiles for faster CPU train steps when host memory is kept (see
      `marljax.host_memory`; benchmarks/RESULTS.md, "Unrolled layers").
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_type: str = "default"
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_position_embeddings: int = 8192
    max_position_embeddings: int = 32768
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None
    # runtime
    dtype: str = "float32"
    param_dtype: str = "float32"
    remat: str = "none"
    attention_impl: str | None = None
    scan_layers: bool = True

    def __post_init__(self):
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {self.architecture!r}; supported: "
                f"{sorted(SUPPORTED_ARCHITECTURES)}"
            )
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "max_position_embeddings",
            "rope_original_max_position_embeddings",
        ):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {v!r}")
        for name in (
            "rms_norm_eps",
            "rope_theta",
            "rope_factor",
            "rope_low_freq_factor",
            "rope_high_freq_factor",
        ):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:
                raise ValueError(f"ModelConfig.{name} must be a positive number, got {v!r}")
        for name in ("qkv_bias", "o_bias", "qk_norm", "tie_word_embeddings", "scan_layers"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"ModelConfig.{name} must be a bool, got {getattr(self, name)!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"ModelConfig.num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim must be even for rotary embeddings, got {self.head_dim}")
        if self.rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(
                f"unsupported rope_scaling type {self.rope_type!r}; supported: {SUPPORTED_ROPE_TYPES}"
            )
        if self.rope_type == "llama3" and self.rope_high_freq_factor <= self.rope_low_freq_factor:
            raise ValueError("rope_scaling: high_freq_factor must be > low_freq_factor for 'llama3'")
        for name in ("dtype", "param_dtype"):
            value = getattr(self, name)
            if not isinstance(value, str):  # accept jnp.bfloat16, np.float32, ...
                with contextlib.suppress(TypeError):
                    object.__setattr__(self, name, np.dtype(value).name)
            if getattr(self, name) not in DTYPES:
                raise ValueError(f"ModelConfig.{name} must be one of {DTYPES}, got {getattr(self, name)!r}")
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"ModelConfig.remat must be one of {REMAT_POLICIES}, got {self.remat!r}")
        if self.attention_impl == "auto":
            object.__setattr__(
                self, "attention_impl", platform_attention(self.dtype, self.head_dim, jax.default_backend())
            )
        if self.attention_impl not in ATTENTION_IMPLS:
            raise ValueError(
                f"ModelConfig.attention_impl must be one of {ATTENTION_IMPLS}, got {self.attention_impl!r}"
            )
        if isinstance(self.eos_token_id, list):  # keep the dataclass hashable
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))

    # ------------------------------------------------------------------ derived
    @property
    def model_type(self) -> str:
        return SUPPORTED_ARCHITECTURES[self.architecture]

    @property
    def num_groups(self) -> int:
        """Query heads per key/value head (the GQA ratio)."""
        return self.num_heads // self.num_kv_heads

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with some fields changed (validated again)."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"unknown ModelConfig field(s): {sorted(unknown)}")
        return dataclasses.replace(self, **changes)

    def num_params(self) -> int:
        """Number of parameters (embeddings counted once when tied)."""
        d, f, h = self.hidden_size, self.intermediate_size, self.head_dim
        q, kv = self.num_heads * h, self.num_kv_heads * h
        per_layer = d * (q + 2 * kv) + q * d + 3 * d * f + 2 * d
        per_layer += (q + 2 * kv) * self.qkv_bias + d * self.o_bias + 2 * h * self.qk_norm
        embed = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + embed + d

    # ------------------------------------------------------------- HF configs
    @classmethod
    def from_hf(cls, hf_config: Any, **runtime: Any) -> ModelConfig:
        """Build from a transformers `PretrainedConfig` (or its `to_dict()`).

        `runtime` sets `dtype`, `param_dtype`, `remat`, `attention_impl`, `scan_layers`.
        Raises ValueError naming the key for anything not supported.
        """
        d: Mapping[str, Any] = hf_config if isinstance(hf_config, Mapping) else hf_config.to_dict()
        archs = d.get("architectures")
        model_type = d.get("model_type")
        if archs:
            if len(archs) != 1 or archs[0] not in SUPPORTED_ARCHITECTURES:
                raise ValueError(
                    f"unsupported architecture(s) {archs} in config key 'architectures'; "
                    f"supported: {sorted(SUPPORTED_ARCHITECTURES)}"
                )
            family = by_architecture(archs[0])
            if model_type is not None and family.model_type != model_type:
                raise ValueError(
                    f"config key 'model_type' is {model_type!r} but 'architectures' says {archs[0]!r}"
                )
        elif model_type in FAMILIES:
            family = FAMILIES[model_type]
        else:
            raise ValueError(
                f"unsupported model_type {model_type!r} (config has no 'architectures'); "
                f"supported: {sorted(FAMILIES)}"
            )

        def need(key):
            if d.get(key) is None:
                raise ValueError(f"config key {key!r} is missing")
            return d[key]

        for refusal in family.refusals:
            value = d.get(refusal.key, refusal.default)
            if not refusal.supported(value):
                raise ValueError(refusal.message(value))

        # rope: transformers>=5 keeps `rope_parameters` (with rope_theta inside);
        # older versions use `rope_theta` + `rope_scaling`.
        rope = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
        theta = rope.get("rope_theta", d.get("rope_theta", 10000.0))
        rope_type = rope.get("rope_type", rope.get("type", "default")) or "default"
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(
                f"unsupported rope_scaling type {rope_type!r} (config key 'rope_parameters'/"
                f"'rope_scaling'); supported: {SUPPORTED_ROPE_TYPES}"
            )
        if float(rope.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0)) or 1.0) != 1.0:
            raise ValueError("unsupported config value partial_rotary_factor != 1")
        rope_kw: dict[str, Any] = {"rope_theta": float(theta), "rope_type": rope_type}
        if rope_type in ("linear", "llama3"):
            if "factor" not in rope:
                raise ValueError(f"rope_scaling type {rope_type!r} needs key 'factor'")
            rope_kw["rope_factor"] = float(rope["factor"])
        if rope_type == "llama3":
            for key, field in (
                ("low_freq_factor", "rope_low_freq_factor"),
                ("high_freq_factor", "rope_high_freq_factor"),
                ("original_max_position_embeddings", "rope_original_max_position_embeddings"),
            ):
                if key not in rope:
                    raise ValueError(f"rope_scaling type 'llama3' needs key {key!r}")
                rope_kw[field] = rope[key] if key.startswith("original") else float(rope[key])

        hidden, heads = int(need("hidden_size")), int(need("num_attention_heads"))
        head_dim = d.get("head_dim") or hidden // heads
        kv = d.get("num_key_value_heads") or heads
        qkv_bias, o_bias = family.fixed_biases or (bool(d.get("attention_bias", False)),) * 2
        return cls(
            architecture=family.architecture,
            vocab_size=int(need("vocab_size")),
            hidden_size=hidden,
            intermediate_size=int(need("intermediate_size")),
            num_layers=int(need("num_hidden_layers")),
            num_heads=heads,
            num_kv_heads=int(kv),
            head_dim=int(head_dim),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(d.get("max_position_embeddings") or 32768),
            qkv_bias=qkv_bias,
            o_bias=o_bias,
            qk_norm=family.qk_norm,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=d.get("eos_token_id"),
            pad_token_id=d.get("pad_token_id"),
            **rope_kw,
            **runtime,
        )

    def to_hf_dict(self) -> dict[str, Any]:
        """The Hugging Face config keys (transformers>=5 layout) for this model."""
        d: dict[str, Any] = {
            "architectures": [self.architecture],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_id)
            if isinstance(self.eos_token_id, tuple)
            else self.eos_token_id,
            "pad_token_id": self.pad_token_id,
        }
        family = by_architecture(self.architecture)
        if family.fixed_biases is not None:
            if (self.qkv_bias, self.o_bias) != family.fixed_biases:
                raise ValueError(
                    f"{self.architecture} checkpoints have (qkv_bias, o_bias) = {family.fixed_biases}"
                )
        else:
            if self.qkv_bias != self.o_bias:
                raise ValueError(f"{self.architecture} has one attention_bias switch for q/k/v/o")
            d["attention_bias"] = self.qkv_bias
        if self.qk_norm != family.qk_norm:
            raise ValueError(f"{self.architecture} checkpoints have qk_norm={family.qk_norm}")
        rope: dict[str, Any] = {"rope_type": self.rope_type, "rope_theta": self.rope_theta}
        if self.rope_type in ("linear", "llama3"):
            rope["factor"] = self.rope_factor
        if self.rope_type == "llama3":
            rope.update(
                low_freq_factor=self.rope_low_freq_factor,
                high_freq_factor=self.rope_high_freq_factor,
                original_max_position_embeddings=self.rope_original_max_position_embeddings,
            )
        d["rope_parameters"] = rope
        # transformers<5 spelling of the same information
        d["rope_theta"] = self.rope_theta
        d["rope_scaling"] = None if self.rope_type == "default" else dict(rope)
        return d

    def to_hf_config(self):
        """A `transformers.PretrainedConfig` of the matching class."""
        import transformers

        d = self.to_hf_dict()
        model_type = d.pop("model_type")
        if hasattr(transformers.LlamaConfig(), "rope_parameters"):  # transformers>=5
            d.pop("rope_theta"), d.pop("rope_scaling")
        else:
            d.pop("rope_parameters")
        cfg = transformers.AutoConfig.for_model(model_type, **d)
        if hasattr(cfg, "dtype") or not hasattr(cfg, "torch_dtype"):
            cfg.dtype = self.param_dtype
        else:
            cfg.torch_dtype = self.param_dtype
        return cfg

    # ---------------------------------------------------------------- presets
    @classmethod
    def preset(cls, name: str, **changes: Any) -> ModelConfig:
        """A named config (see `PRESETS`), optionally with fields changed."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; known: {sorted(PRESETS)}")
        return dataclasses.replace(PRESETS[name], **changes) if changes else PRESETS[name]


# Named configs of the registered families: the tiny random ones (for tests and demos) first,
# then real shapes (for memory planning and benchmarks).
PRESETS: dict[str, ModelConfig] = {
    name: ModelConfig(architecture=family.architecture, **fields)
    for tiny in (True, False)
    for family in FAMILIES.values()
    for name, fields in family.presets.items()
    if name.startswith("tiny-") == tiny
}
