"""Flax NNX ports of Qwen-family decoders (Qwen2/2.5, Qwen3, Llama 3.x).

    from marljax.models import from_pretrained, load_tokenizer, make_mesh
    model, config = from_pretrained("path/to/Qwen3-0.6B", dtype="bfloat16",
                                    mesh=make_mesh(fsdp=4, tensor=2))
    logits, _ = model(input_ids, positions, attention_mask)         # [B, T, V] float32

Hot paths use the pure functions over plain parameter dicts:
`forward`, `hidden_states`, `token_logprobs` with `params = get_params(model)`;
`marljax.models.decode` is the sampler's one-token step over the same layer maths.
`abstract_model(config)` gives shapes, dtypes and sharding metadata without allocating.
A family's facts (HF names, switches, chat markup, presets) are one registered record in
`marljax.models.families`; random checkpoints for tests and demos are in `marljax.testing`.
"""

from marljax.models.config import PRESETS, SUPPORTED_ARCHITECTURES, ModelConfig
from marljax.models.decoder import (
    Decoder,
    KVCache,
    abstract_model,
    cache_sharding,
    forward,
    get_params,
    hidden_states,
    init_cache,
    init_model,
    logprobs_from_hidden,
    param_dict_shardings,
    positions_from_mask,
    rms_norm,
    set_params,
    token_logprobs,
    unembed,
)
from marljax.models.hf_io import CheckpointError, from_pretrained, load_tokenizer, save_pretrained, tensor_map
from marljax.models.rope import apply_rope, inverse_frequencies
from marljax.models.sharding import (
    LOGICAL_AXIS_RULES,
    MESH_AXES,
    batch_sharding,
    logical_to_spec,
    make_mesh,
    param_shardings,
    param_specs,
    shard_model,
)

__all__ = [
    "PRESETS",
    "SUPPORTED_ARCHITECTURES",
    "ModelConfig",
    "Decoder",
    "KVCache",
    "abstract_model",
    "cache_sharding",
    "forward",
    "get_params",
    "hidden_states",
    "init_cache",
    "init_model",
    "logprobs_from_hidden",
    "param_dict_shardings",
    "positions_from_mask",
    "rms_norm",
    "set_params",
    "token_logprobs",
    "unembed",
    "CheckpointError",
    "from_pretrained",
    "load_tokenizer",
    "save_pretrained",
    "tensor_map",
    "apply_rope",
    "inverse_frequencies",
    "LOGICAL_AXIS_RULES",
    "MESH_AXES",
    "batch_sharding",
    "logical_to_spec",
    "make_mesh",
    "param_shardings",
    "param_specs",
    "shard_model",
]
