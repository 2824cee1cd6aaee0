"""Model families: everything marljax knows about one family, in one registered record.

A `Family` holds a family's Hugging Face identity (architecture and `model_type`), the switches
its checkpoints fix (attention biases, Qwen3's q/k RMSNorm), the config keys it refuses, tensor-name
overrides, its chat markup and tool-call style with their special tokens, its named configs
(a tiny random one and real shapes) and the checkpoints the test fixtures imitate.
`ModelConfig.from_hf` / `to_hf_dict`, `hf_io.tensor_map`, the presets and the fixtures in
`marljax.testing` all read these records. A new family is one `register(Family(...))` here; the
parity test compares its `parity_cases` with transformers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class Refusal:
    """An HF config key whose value changes the maths in a way marljax does not implement."""

    key: str
    default: Any  # the value an absent key means
    supported: Callable[[Any], bool]  # the key's value -> whether marljax implements it
    message: Callable[[Any], str]


def _no_sliding(layer_types) -> bool:
    return not layer_types or all(t == "full_attention" for t in layer_types)


# Refused by every family today (a family whose checkpoints use one of these would need the maths).
REFUSALS = (
    Refusal(
        "hidden_act",
        "silu",
        lambda v: v == "silu",
        lambda v: f"unsupported config value hidden_act={v!r} (only 'silu')",
    ),
    Refusal("mlp_bias", False, lambda v: not v, lambda v: "unsupported config value mlp_bias=True"),
    Refusal(
        "use_sliding_window",
        False,
        lambda v: not v,
        lambda v: "unsupported config value use_sliding_window=True (sliding-window attention)",
    ),
    Refusal(
        "layer_types",
        None,
        _no_sliding,
        lambda v: f"unsupported config value layer_types={sorted(set(v))} (only 'full_attention')",
    ),
    Refusal(
        "attention_dropout",
        0.0,
        lambda v: float(v or 0.0) == 0.0,
        lambda v: "unsupported config value attention_dropout != 0",
    ),
    Refusal(
        "pretraining_tp",
        1,
        lambda v: int(v or 1) == 1,
        lambda v: "unsupported config value pretraining_tp != 1",
    ),
)


@dataclasses.dataclass(frozen=True)
class ChatStyle:
    """How a family's instruct models mark up a conversation.

    `specials` sit at ids `first_special_id, first_special_id + 1, ...` (the regular vocabulary fills
    the ids below); `roles` are the tokenizer's eos / pad / bos tokens; `bos_prefix`: plain text
    starts with `specials[0]`; `tool_call_style`: a key of `marljax.models.chat.TOOL_CALL_STYLES`."""

    first_special_id: int
    specials: tuple[str, ...]
    template: str
    roles: Mapping[str, str]
    tool_call_style: str
    bos_prefix: bool = False


@dataclasses.dataclass(frozen=True)
class RealCheckpoint:
    """A real checkpoint's HF config keys and `generation_config.json` (its turn-end eos ids)."""

    config: Mapping[str, Any]
    generation: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class Family:
    """One model family (module doc).

    fixed_biases: `(qkv_bias, o_bias)` every checkpoint of the family has, or None when the HF key
    `attention_bias` sets both. presets: named `ModelConfig`s (field values), "tiny-<model_type>" a
    tiny random one for tests and demos. tiny_checkpoint: the HF config keys of the family's tiny
    test checkpoint (over the fixtures' common tiny sizes). real_checkpoints: real shapes the
    fixtures write random checkpoints of. tensor_names: HF tensor names that differ from the Llama
    layout, by the `hf_io.tensor_map` name. parity_cases: tiny checkpoints (name -> HF config
    overrides of `tiny_checkpoint`) that the parity tests compare with transformers
    (`marljax.testing.parity.CASES`).
    """

    model_type: str
    architecture: str
    chat: ChatStyle
    presets: Mapping[str, Mapping[str, Any]]
    tiny_checkpoint: Mapping[str, Any]
    fixed_biases: tuple[bool, bool] | None = None
    qk_norm: bool = False
    refusals: tuple[Refusal, ...] = REFUSALS
    tensor_names: Mapping[str, str] = dataclasses.field(default_factory=dict)
    real_checkpoints: Mapping[str, RealCheckpoint] = dataclasses.field(default_factory=dict)
    parity_cases: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)


FAMILIES: dict[str, Family] = {}  # model_type -> record, in registration order


def register(family: Family) -> Family:
    """Add `family` to `FAMILIES`; a second record for one model type or architecture is an error."""
    for other in FAMILIES.values():
        if family.model_type == other.model_type or family.architecture == other.architecture:
            raise ValueError(f"family {family.model_type!r} ({family.architecture}) is registered already")
    FAMILIES[family.model_type] = family
    return family


def by_architecture(architecture: str) -> Family:
    """The registered family of an HF architecture name (KeyError if none)."""
    for family in FAMILIES.values():
        if family.architecture == architecture:
            return family
    raise KeyError(architecture)


# ------------------------------------------------------------------ chat markup
CHATML_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Qwen2.5 and Qwen3 share ChatML and its ids (151643, 151644, 151645) and Hermes-style tool calls.
QWEN_CHAT = ChatStyle(
    first_special_id=151643,
    specials=CHATML_SPECIALS,
    template=CHATML_TEMPLATE,
    roles=dict(eos_token="<|im_end|>", pad_token="<|endoftext|>"),
    tool_call_style="qwen",
)

LLAMA3_SPECIALS = (
    "<|begin_of_text|>",  # 128000
    "<|end_of_text|>",  # 128001
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|reserved_special_token_2|>",
    "<|start_header_id|>",  # 128006
    "<|end_header_id|>",  # 128007
    "<|eom_id|>",  # 128008
    "<|eot_id|>",  # 128009
    "<|python_tag|>",
    *(f"<|reserved_special_token_{i}|>" for i in range(3, 248)),  # up to 128255, as Llama 3 has
)
# Llama 3's header format, written from its description: every turn is
# <|start_header_id|>role<|end_header_id|>\n\n content <|eot_id|>, after one <|begin_of_text|>.
LLAMA3_TEMPLATE = (
    "{{- '<|begin_of_text|>' }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
    " + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
LLAMA3_CHAT = ChatStyle(
    first_special_id=128000,
    specials=LLAMA3_SPECIALS,
    template=LLAMA3_TEMPLATE,
    roles=dict(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>"),
    tool_call_style="llama",
    bos_prefix=True,
)

# ------------------------------------------------------------------ the families
# sizes of the tiny random presets (about 0.1M parameters), for tests and demos
TINY_PRESET = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    max_position_embeddings=512,
)

QWEN2 = register(
    Family(  # Qwen2 and Qwen2.5: q/k/v biases, no o_proj bias, untied embeddings by default
        model_type="qwen2",
        architecture="Qwen2ForCausalLM",
        fixed_biases=(True, False),
        chat=QWEN_CHAT,
        presets={
            "tiny-qwen2": dict(qkv_bias=True, **TINY_PRESET),
            "qwen2.5-0.5b": dict(
                vocab_size=151936,
                hidden_size=896,
                intermediate_size=4864,
                num_layers=24,
                num_heads=14,
                num_kv_heads=2,
                head_dim=64,
                rope_theta=1e6,
                qkv_bias=True,
                tie_word_embeddings=True,
                max_position_embeddings=32768,
            ),
        },
        tiny_checkpoint=dict(tie_word_embeddings=False, rope_theta=10000.0),
        parity_cases={  # biases; untied and tied embeddings; GQA ratios 2 and 4
            "qwen2-untied-gqa2": {},
            "qwen2-tied-gqa4": dict(tie_word_embeddings=True, num_key_value_heads=1),
        },
        real_checkpoints={
            "qwen2.5-0.5b": RealCheckpoint(
                dict(
                    vocab_size=151936,
                    hidden_size=896,
                    intermediate_size=4864,
                    num_hidden_layers=24,
                    num_attention_heads=14,
                    num_key_value_heads=2,
                    max_position_embeddings=32768,
                    rope_theta=1000000.0,
                    rms_norm_eps=1e-6,
                    tie_word_embeddings=True,
                    bos_token_id=151643,
                    eos_token_id=151645,
                    pad_token_id=None,
                ),
                dict(bos_token_id=151643, pad_token_id=151643, eos_token_id=[151645, 151643]),
            )
        },
    )
)

QWEN3 = register(
    Family(  # Qwen3: q/k RMSNorm, head_dim independent of hidden_size / heads, tied embeddings
        model_type="qwen3",
        architecture="Qwen3ForCausalLM",
        qk_norm=True,
        chat=QWEN_CHAT,
        presets={
            "tiny-qwen3": dict(
                qk_norm=True, tie_word_embeddings=True, rope_theta=1e6, **{**TINY_PRESET, "head_dim": 32}
            ),
            "qwen3-0.6b": dict(
                vocab_size=151936,
                hidden_size=1024,
                intermediate_size=3072,
                num_layers=28,
                num_heads=16,
                num_kv_heads=8,
                head_dim=128,
                rope_theta=1e6,
                qk_norm=True,
                tie_word_embeddings=True,
                max_position_embeddings=40960,
            ),
        },
        # head_dim (32) != hidden_size / heads (16)
        tiny_checkpoint=dict(head_dim=32, tie_word_embeddings=True, rope_theta=1000000.0),
        parity_cases={  # q/k norm; attention biases incl. o_proj
            "qwen3-tied-gqa2": {},
            "qwen3-untied-gqa4-bias": dict(
                tie_word_embeddings=False, num_key_value_heads=1, attention_bias=True
            ),
        },
    )
)

LLAMA = register(
    Family(  # Llama 3.x (and Llama-based models such as Nemotron-Llama): llama3 rope scaling
        model_type="llama",
        architecture="LlamaForCausalLM",
        chat=LLAMA3_CHAT,
        presets={
            "tiny-llama": dict(
                rope_theta=500000.0,
                rope_type="llama3",
                rope_factor=8.0,
                rope_low_freq_factor=1.0,
                rope_high_freq_factor=4.0,
                rope_original_max_position_embeddings=64,
                **TINY_PRESET,
            ),
        },
        # llama3 rope scaling whose bands fall inside the tiny head_dim
        tiny_checkpoint=dict(
            tie_word_embeddings=False,
            rope_theta=10000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        ),
        parity_cases={  # Llama 3 and linear rope scaling; GQA ratio 1; biases; tied embeddings
            "llama3rope-gqa1": dict(num_key_value_heads=4),
            "llama-linearrope-bias-tied": dict(
                rope_scaling={"rope_type": "linear", "factor": 2.0},
                attention_bias=True,
                tie_word_embeddings=True,
            ),
        },
        real_checkpoints={
            "llama-3.2-1b": RealCheckpoint(
                dict(
                    vocab_size=128256,
                    hidden_size=2048,
                    intermediate_size=8192,
                    num_hidden_layers=16,
                    num_attention_heads=32,
                    num_key_value_heads=8,
                    head_dim=64,
                    max_position_embeddings=131072,
                    rope_theta=500000.0,
                    rms_norm_eps=1e-5,
                    tie_word_embeddings=True,
                    rope_scaling={
                        "rope_type": "llama3",
                        "factor": 32.0,
                        "low_freq_factor": 1.0,
                        "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 8192,
                    },
                    bos_token_id=128000,
                    eos_token_id=[128001, 128008, 128009],
                    pad_token_id=None,
                ),
                dict(bos_token_id=128000, eos_token_id=[128001, 128008, 128009]),
            )
        },
    )
)
