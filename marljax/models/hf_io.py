"""Hugging Face checkpoints in and out: `from_pretrained`, `save_pretrained`.

Loading never materialises the whole model on one device: the module is built
abstractly (`abstract_model`), every parameter gets its `NamedSharding` from
the rule table, and `jax.make_array_from_callback` asks each device only for
its own slice, which is read from the safetensors files alone. All names,
shapes and dtypes are checked against the headers before any weight is read,
so a bad checkpoint fails with an error naming the file and tensor, never
with a half-loaded model.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
import safetensors
from flax import nnx
from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding

from marljax.models.config import SUPPORTED_ARCHITECTURES, ModelConfig
from marljax.models.decoder import Decoder, abstract_model, get_params
from marljax.models.families import by_architecture
from marljax.models.sharding import LogicalRules, logical_to_spec

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

_ST_DTYPES = ("BF16", "F16", "F32", "F64")  # safetensors' names of the float dtypes loaded


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be loaded (message names file/tensor)."""


# ---------------------------------------------------------- safetensors (read)
class _SafetensorsFile:
    """One open safetensors file; `read` copies only the requested block of a tensor."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self._file = safetensors.safe_open(str(path), framework="numpy")
        except Exception as e:  # safetensors raises its own SafetensorError, or OSError
            raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from e
        self.names = set(self._file.keys())

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._file.get_slice(name).get_shape())

    def dtype(self, name: str) -> str:
        return self._file.get_slice(name).get_dtype()

    def read(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
        return self._file.get_slice(name)[index]


# --------------------------------------------------------------- name mapping
@dataclasses.dataclass(frozen=True)
class _Tensor:
    """One parameter <-> one HF tensor per layer (`{i}` in `hf`) or one tensor."""

    path: tuple[str, ...]  # key path in get_params(model)
    hf: str
    to_ours: Callable[[np.ndarray], np.ndarray]  # HF layout -> ours (views only)
    to_hf: Callable[[np.ndarray], np.ndarray]  # ours -> HF layout
    # a block of ours (one slice per axis) -> the HF block that holds it, and the slices that
    # cut it out of that block once converted by `to_ours`
    hf_index: Callable[[tuple[slice, ...]], tuple[tuple[slice, ...], tuple[slice, ...]]]
    hf_shape: tuple[int, ...]  # per layer

    @property
    def stacked(self) -> bool:
        return "{i}" in self.hf


def tensor_map(config: ModelConfig) -> list[_Tensor]:
    """The parameter <-> Hugging Face tensor-name table for `config`: the Llama layout, with the
    family's own names where its record has them (`Family.tensor_names`)."""
    c = config
    D, F, N, K, H, V = (
        c.hidden_size,
        c.intermediate_size,
        c.num_heads,
        c.num_kv_heads,
        c.head_dim,
        c.vocab_size,
    )

    def ident(x):
        return x

    def tr(x):
        return x.T

    def heads(s: slice, n: int) -> slice:  # heads s of n -> their rows of an [n*H] axis
        start, stop, _ = s.indices(n)
        return slice(start * H, stop * H)

    every = slice(None)
    same = (ident, ident, lambda i: (i, ()))
    transposed = (tr, tr, lambda i: (i[::-1], ()))

    def proj_in(n):  # [n*H, D] <-> [D, n, H]
        return (
            lambda x: x.reshape(x.shape[0] // H, H, x.shape[1]).transpose(2, 0, 1),
            lambda x: x.transpose(1, 2, 0).reshape(n * H, D),
            lambda i: ((heads(i[1], n), i[0]), (every, every, i[2])),
        )

    def bias(n):  # [n*H] <-> [n, H]
        return (
            lambda x: x.reshape(x.shape[0] // H, H),
            lambda x: x.reshape(n * H),
            lambda i: ((heads(i[0], n),), (every, i[1])),
        )

    o_proj = (  # [D, N*H] <-> [N, H, D]
        lambda x: x.reshape(x.shape[0], x.shape[1] // H, H).transpose(1, 2, 0),
        lambda x: x.transpose(2, 0, 1).reshape(D, N * H),
        lambda i: ((i[2], heads(i[0], N)), (every, i[1], every)),
    )
    L = "model.layers.{i}."
    out = [
        _Tensor(("embed",), "model.embed_tokens.weight", *same, (V, D)),
        _Tensor(("final_norm",), "model.norm.weight", *same, (D,)),
        _Tensor(("layers", "attn_norm"), L + "input_layernorm.weight", *same, (D,)),
        _Tensor(("layers", "mlp_norm"), L + "post_attention_layernorm.weight", *same, (D,)),
        _Tensor(("layers", "wq"), L + "self_attn.q_proj.weight", *proj_in(N), (N * H, D)),
        _Tensor(("layers", "wk"), L + "self_attn.k_proj.weight", *proj_in(K), (K * H, D)),
        _Tensor(("layers", "wv"), L + "self_attn.v_proj.weight", *proj_in(K), (K * H, D)),
        _Tensor(("layers", "wo"), L + "self_attn.o_proj.weight", *o_proj, (D, N * H)),
        _Tensor(("layers", "w_gate"), L + "mlp.gate_proj.weight", *transposed, (F, D)),
        _Tensor(("layers", "w_up"), L + "mlp.up_proj.weight", *transposed, (F, D)),
        _Tensor(("layers", "w_down"), L + "mlp.down_proj.weight", *transposed, (D, F)),
    ]
    if not c.tie_word_embeddings:
        out.append(_Tensor(("lm_head",), "lm_head.weight", *transposed, (V, D)))
    if c.qkv_bias:
        out += [
            _Tensor(("layers", "bq"), L + "self_attn.q_proj.bias", *bias(N), (N * H,)),
            _Tensor(("layers", "bk"), L + "self_attn.k_proj.bias", *bias(K), (K * H,)),
            _Tensor(("layers", "bv"), L + "self_attn.v_proj.bias", *bias(K), (K * H,)),
        ]
    if c.o_bias:
        out.append(_Tensor(("layers", "bo"), L + "self_attn.o_proj.bias", *same, (D,)))
    if c.qk_norm:
        out += [
            _Tensor(("layers", "q_norm"), L + "self_attn.q_norm.weight", *same, (H,)),
            _Tensor(("layers", "k_norm"), L + "self_attn.k_norm.weight", *same, (H,)),
        ]
    renamed = by_architecture(c.architecture).tensor_names
    return [dataclasses.replace(t, hf=renamed[t.path[-1]]) if t.path[-1] in renamed else t for t in out]


def _hf_names(t: _Tensor, num_layers: int) -> list[str]:
    return [t.hf.format(i=i) for i in range(num_layers)] if t.stacked else [t.hf]


# --------------------------------------------------------------------- load
def _read_config(path: Path, **runtime) -> ModelConfig:
    cfg_path = path / CONFIG_FILE
    if not cfg_path.is_file():
        raise CheckpointError(f"{cfg_path}: missing (a Hugging Face model directory needs {CONFIG_FILE})")
    try:
        raw = json.loads(cfg_path.read_text())
    except ValueError as e:
        raise CheckpointError(f"{cfg_path}: not valid JSON ({e})") from e
    archs = raw.get("architectures")
    if archs and (len(archs) != 1 or archs[0] not in SUPPORTED_ARCHITECTURES):
        raise CheckpointError(
            f"{cfg_path}: unsupported architecture(s) {archs}; supported: {sorted(SUPPORTED_ARCHITECTURES)}"
        )
    import transformers

    try:
        hf = transformers.AutoConfig.from_pretrained(str(path))
    except Exception as e:  # transformers raises ValueError/KeyError/OSError variously
        raise CheckpointError(f"{cfg_path}: transformers cannot read it ({e})") from e
    try:
        return ModelConfig.from_hf(hf, **runtime)
    except ValueError as e:
        raise CheckpointError(f"{cfg_path}: {e}") from e


def _open_weights(path: Path) -> dict[str, _SafetensorsFile]:
    """tensor name -> file holding it."""
    index, single = path / INDEX_FILE, path / SINGLE_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError) as e:
            raise CheckpointError(f"{index}: not a safetensors index with a 'weight_map' ({e})") from e
        files: dict[str, _SafetensorsFile] = {}
        where: dict[str, _SafetensorsFile] = {}
        for name, fname in weight_map.items():
            if fname not in files:
                fpath = path / fname
                if not fpath.is_file():
                    raise CheckpointError(f"{fpath}: missing (listed in {index} for tensor {name!r})")
                files[fname] = _SafetensorsFile(fpath)
            if name not in files[fname].names:
                raise CheckpointError(f"{files[fname].path}: has no tensor {name!r} (listed in {index})")
            where[name] = files[fname]
        return where
    if single.is_file():
        f = _SafetensorsFile(single)
        return {name: f for name in f.names}
    others = sorted(p.name for p in path.glob("*.bin")) + sorted(p.name for p in path.glob("*.pt*"))
    hint = f" (found {others}; only safetensors are supported)" if others else ""
    raise CheckpointError(f"{path}: no weights: expected {SINGLE_FILE} or {INDEX_FILE}{hint}")


def _check_tensors(config: ModelConfig, where: dict[str, _SafetensorsFile], path: Path):
    table = tensor_map(config)
    expected = {name: t for t in table for name in _hf_names(t, config.num_layers)}
    missing = sorted(set(expected) - set(where))
    if missing:
        files = sorted({str(f.path) for f in where.values()}) or [str(path)]
        raise CheckpointError(
            f"missing tensor(s) {missing[:8]}{' ...' if len(missing) > 8 else ''} "
            f"({len(missing)} in all) in {files}"
        )
    unexpected = sorted(set(where) - set(expected))
    if config.tie_word_embeddings and "lm_head.weight" in unexpected:
        unexpected.remove("lm_head.weight")  # some tied checkpoints store the copy; it is ignored
    if unexpected:
        raise CheckpointError(
            f"unexpected tensor(s) {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''} in "
            f"{where[unexpected[0]].path} for {config.architecture} (config.json says "
            f"tie_word_embeddings={config.tie_word_embeddings}, num_hidden_layers={config.num_layers})"
        )
    for name, t in expected.items():
        f = where[name]
        if f.shape(name) != t.hf_shape:
            raise CheckpointError(
                f"{f.path}: tensor {name!r} has shape {list(f.shape(name))}, "
                f"expected {list(t.hf_shape)} from {CONFIG_FILE}"
            )
        if f.dtype(name) not in _ST_DTYPES:
            raise CheckpointError(
                f"{f.path}: tensor {name!r} has dtype {f.dtype(name)}, expected one of {sorted(_ST_DTYPES)}"
            )
    return table


def from_pretrained(
    path: str | os.PathLike,
    *,
    dtype: Any = "float32",
    param_dtype: Any = None,
    mesh: Mesh | None = None,
    rules: LogicalRules | None = None,
    remat: str = "none",
    attention_impl: str | None = None,
    scan_layers: bool = True,
):
    """Load a Hugging Face Qwen2/Qwen2.5/Qwen3/Llama checkpoint directory.

    Args:
      path: local directory with `config.json` and `model.safetensors` (or a
        sharded `model.safetensors.index.json`).
      dtype: compute dtype ("float32", "bfloat16"). param_dtype: storage dtype
        of the parameters (default: `dtype`); weights are cast on the host.
      mesh: place each parameter with its `NamedSharding` from `rules`
        (default `LOGICAL_AXIS_RULES`); None puts everything on `jax.devices()[0]`.
      remat, attention_impl, scan_layers: see `ModelConfig`.

    Returns:
      `(model, config)`: a `Decoder` and its `ModelConfig`.

    Raises:
      CheckpointError (a ValueError) naming the file and tensor for a missing
      directory/config/weights, an unsupported architecture or option, a missing
      or unexpected tensor, or a shape mismatch. (A `lm_head.weight` stored in a
      checkpoint whose config ties embeddings is ignored, as transformers does.)
    """
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a directory")
    config = _read_config(
        path,
        dtype=dtype,
        param_dtype=param_dtype or dtype,
        remat=remat,
        attention_impl=attention_impl,
        scan_layers=scan_layers,
    )
    where = _open_weights(path)
    table = {t.path: t for t in _check_tensors(config, where, path)}

    graphdef, state = nnx.split(abstract_model(config))
    flat = nnx.to_flat_state(state)
    for key, var in flat:
        t = table[tuple(str(k) for k in key)]
        sds = var.get_value()
        if mesh is None:
            sharding = SingleDeviceSharding(jax.devices()[0])
        else:
            spec = logical_to_spec(var.get_metadata()["logical_axes"], sds.shape, mesh, rules)
            sharding = NamedSharding(mesh, spec)
        var.set_value(_load_array(t, where, sds.shape, sds.dtype, sharding, config.num_layers))
    return nnx.merge(graphdef, nnx.from_flat_state(flat)), config


def _load_array(t: _Tensor, where, shape, dtype, sharding, num_layers: int) -> jax.Array:
    names = _hf_names(t, num_layers)

    def host(name, index):
        hf_index, rest = t.hf_index(index)
        return np.asarray(t.to_ours(where[name].read(name, hf_index))[rest]).astype(dtype)

    def callback(index):
        if t.stacked:
            parts = [host(names[i], index[1:]) for i in range(num_layers)[index[0]]]
            return np.stack(parts) if parts else np.zeros((0,) + shape[1:], dtype)
        return host(names[0], index)

    return jax.make_array_from_callback(tuple(shape), sharding, callback)


# --------------------------------------------------------------------- save
def _to_host(x: jax.Array) -> np.ndarray:
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(jax.device_get(x))


def save_pretrained(
    model: Decoder, path: str | os.PathLike, *, tokenizer: Any = None, max_shard_size: int = 5 * 1024**3
) -> Path:
    """Write `model` as a Hugging Face directory: `config.json` plus safetensors
    (one `model.safetensors`, or shards and `model.safetensors.index.json` above
    `max_shard_size` bytes), in the parameter dtype. Loadable by
    `transformers.AutoModelForCausalLM.from_pretrained` and `from_pretrained`.
    Also saves `tokenizer` (a transformers tokenizer) if given. On multi-host
    runs every process must call it; process 0 writes. Returns the path.
    """
    from safetensors.numpy import save_file

    config: ModelConfig = model.config
    path = Path(path)
    params = get_params(model)
    table = tensor_map(config)
    # plan shards from sizes, then pull one shard's tensors to the host at a time
    entries = []
    for t in table:
        arr = params
        for k in t.path:
            arr = arr[k]
        nbytes = math.prod(t.hf_shape) * np.dtype(arr.dtype).itemsize
        for i, name in enumerate(_hf_names(t, config.num_layers)):
            entries.append((name, t, arr, i if t.stacked else None, nbytes))
    shards: list[list] = [[]]
    size = 0
    for e in entries:
        if shards[-1] and size + e[4] > max_shard_size:
            shards.append([])
            size = 0
        shards[-1].append(e)
        size += e[4]
    write = jax.process_index() == 0
    if write:
        path.mkdir(parents=True, exist_ok=True)
        config.to_hf_config().save_pretrained(str(path))
        for stale in (path / SINGLE_FILE, path / INDEX_FILE):
            stale.unlink(missing_ok=True)
    weight_map = {}
    n = len(shards)
    cache: dict[int, np.ndarray] = {}
    for s, shard in enumerate(shards):
        fname = SINGLE_FILE if n == 1 else f"model-{s + 1:05d}-of-{n:05d}.safetensors"
        tensors = {}
        for name, t, arr, layer, _ in shard:
            if id(arr) not in cache:
                cache.clear()
                cache[id(arr)] = _to_host(arr)
            host = cache[id(arr)]
            tensors[name] = np.ascontiguousarray(t.to_hf(host[layer] if layer is not None else host))
            weight_map[name] = fname
        if write:
            save_file(tensors, str(path / fname), metadata={"format": "pt"})
    if write and n > 1:
        total = sum(e[4] for e in entries)
        (path / INDEX_FILE).write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
        )
    if write and tokenizer is not None:
        tokenizer.save_pretrained(str(path))
    return path


# a tokenizer's vocabulary, in one of the files transformers reads it from
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def load_tokenizer(path: str | os.PathLike):
    """`transformers.AutoTokenizer` from a checkpoint directory (chat template included). A
    directory holding none of `TOKENIZER_FILES` is an error: transformers would otherwise build a
    tokenizer with an empty vocabulary from the config files alone."""
    import transformers

    folder = Path(path)
    if not folder.is_dir():
        raise CheckpointError(f"{path}: not a directory (tokenizer)")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise CheckpointError(
            f"{path}: no tokenizer files (one of {', '.join(TOKENIZER_FILES)}); copy them from the "
            "checkpoint's repository or set the model's `tokenizer:` to a directory that has them"
        )
    try:
        return transformers.AutoTokenizer.from_pretrained(str(path))
    except Exception as e:
        raise CheckpointError(f"{path}: cannot load a tokenizer ({e})") from e


PEFT_CONFIG = "adapter_config.json"
PEFT_WEIGHTS = "adapter_model.safetensors"


def save_peft_adapter(
    config: ModelConfig,
    spec: Any,
    adapter: dict,
    path: str | os.PathLike,
    *,
    base_model: str | None = None,
) -> Path:
    """Write a LoRA adapter (`marljax.models.lora`) as a PEFT adapter directory: `adapter_config.json`
    and `adapter_model.safetensors`, loadable with `peft.PeftModel.from_pretrained(hf_base, path)`.

    PEFT's `lora_A` of a module is `[r, in]` and its `lora_B` `[out, r]`, with the update
    `(lora_alpha / r) B A x`: marljax's `a` `[in, r]` and `b` `[r, out]` transposed (the flattened
    head axes are the HF projections' row order). `base_model`: the base's path or hub name,
    recorded for `peft` (None leaves it unset). On multi-host runs process 0 writes.
    """
    from safetensors.numpy import save_file

    from marljax.models.lora import HF_MODULES

    path = Path(path)
    tensors = {}
    for name, ab in adapter.items():
        a, b = _to_host(ab["a"]), _to_host(ab["b"])
        for layer in range(config.num_layers):
            prefix = f"base_model.model.model.layers.{layer}.{HF_MODULES[name]}"
            tensors[f"{prefix}.lora_A.weight"] = np.ascontiguousarray(a[layer].T)
            tensors[f"{prefix}.lora_B.weight"] = np.ascontiguousarray(b[layer].T)
    peft_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": int(spec.rank),
        "lora_alpha": float(spec.alpha),
        "lora_dropout": float(spec.dropout),
        "target_modules": sorted(HF_MODULES[n].split(".")[-1] for n in spec.weights),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "init_lora_weights": True,
        "inference_mode": True,
        "modules_to_save": None,
    }
    if jax.process_index() == 0:
        path.mkdir(parents=True, exist_ok=True)
        (path / PEFT_CONFIG).write_text(json.dumps(peft_config, indent=2))
        save_file(tensors, str(path / PEFT_WEIGHTS), metadata={"format": "pt"})
    return path
