"""Logical axis names, the one rule table mapping them to mesh axes, meshes.

Every parameter carries `logical_axes` metadata (a tuple of names below, one
per dimension). `LOGICAL_AXIS_RULES` maps each name to a mesh axis of the
three-axis mesh `("data", "fsdp", "tensor")`:

- `vocab`, `q_heads`, `kv_heads`, `mlp` -> `tensor` (Megatron-style splits)
- `embed` -> `fsdp` (parameters gathered per layer, ZeRO-3 style)
- `batch` (activations, caches) -> `("data", "fsdp")`
- everything else replicated.

A dimension whose size does not divide the mesh axis (e.g. one kv head on
`tensor=2`) is replicated instead of failing, so one rule table serves every
model size.

This module knows no model: specs are computed over any pytree of parameters
that carry `logical_axes`. The decoder's own helpers (`param_dict_shardings`,
`cache_sharding`) live in `marljax.models.decoder`, which imports this one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")

LogicalRules = Mapping[str, str | tuple[str, ...] | None]

LOGICAL_AXIS_RULES: dict[str, str | tuple[str, ...] | None] = {
    # parameters
    "vocab": "tensor",
    "embed": "fsdp",
    "q_heads": "tensor",
    "kv_heads": "tensor",
    "mlp": "tensor",
    "head_dim": None,
    "norm": None,
    "layers": None,
    # activations / caches
    "batch": ("data", "fsdp"),
    "seq": None,
    "cache_seq": None,
}


def make_mesh(
    data: int = 1, fsdp: int = 1, tensor: int = 1, devices: Sequence[jax.Device] | None = None
) -> Mesh:
    """A `Mesh` of shape `(data, fsdp, tensor)` with axis names `MESH_AXES`.

    Uses the first `data * fsdp * tensor` of `devices` (default `jax.devices()`),
    with `tensor` the fastest-varying axis (neighbouring devices), so tensor
    parallelism stays inside a host / ICI ring.
    """
    sizes = {"data": data, "fsdp": fsdp, "tensor": tensor}
    for name, size in sizes.items():
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"mesh axis {name!r} must be a positive int, got {size!r}")
    devices = list(jax.devices() if devices is None else devices)
    n = data * fsdp * tensor
    if n > len(devices):
        raise ValueError(
            f"mesh data={data} x fsdp={fsdp} x tensor={tensor} needs {n} devices, "
            f"only {len(devices)} available"
        )
    return Mesh(np.array(devices[:n]).reshape(data, fsdp, tensor), MESH_AXES)


def logical_to_spec(
    logical_axes: Sequence[str | None],
    shape: Sequence[int] | None = None,
    mesh: Mesh | None = None,
    rules: LogicalRules | None = None,
) -> P:
    """`PartitionSpec` for one array from its logical axis names.

    With `shape` and `mesh`, dimensions not divisible by their mesh axes are
    replicated; a mesh axis is used at most once per array.
    """
    rules = LOGICAL_AXIS_RULES if rules is None else rules
    used: set[str] = set()
    spec: list[Any] = []
    for i, name in enumerate(logical_axes):
        if name is not None and name not in rules:
            raise ValueError(f"logical axis {name!r} has no entry in the sharding rules")
        target = None if name is None else rules[name]
        axes = () if target is None else ((target,) if isinstance(target, str) else tuple(target))
        axes = tuple(a for a in axes if a not in used)
        if mesh is not None:
            axes = tuple(a for a in axes if a in mesh.shape and mesh.shape[a] > 1)
            if shape is not None and axes and shape[i] % math.prod(mesh.shape[a] for a in axes):
                axes = ()
        used.update(axes)
        spec.append(None if not axes else (axes[0] if len(axes) == 1 else axes))
    while spec and spec[-1] is None:
        spec.pop()
    return P(*spec)


def _is_param(x) -> bool:
    return isinstance(x, nnx.Variable)


def param_specs(state: Any, mesh: Mesh | None = None, rules: LogicalRules | None = None) -> Any:
    """Pytree of `PartitionSpec`s matching `state` (an `nnx.State` of Params).

    Works on abstract states (`nnx.eval_shape`) as well as concrete ones.
    """

    def one(v):
        axes = v.get_metadata().get("logical_axes")
        if axes is None:
            raise ValueError(f"parameter of shape {v.get_value().shape} has no logical_axes metadata")
        return logical_to_spec(axes, v.get_value().shape, mesh, rules)

    return jax.tree.map(one, state, is_leaf=_is_param)


def param_shardings(state: Any, mesh: Mesh, rules: LogicalRules | None = None) -> Any:
    """Pytree of `NamedSharding`s matching `state`."""
    return jax.tree.map(
        lambda s: NamedSharding(mesh, s), param_specs(state, mesh, rules), is_leaf=lambda x: isinstance(x, P)
    )


def shard_model(model: nnx.Module, mesh: Mesh, rules: LogicalRules | None = None) -> nnx.Module:
    """Place every parameter of `model` on `mesh` by the rules (in place; returns `model`)."""
    state = nnx.state(model, nnx.Param)
    shardings = param_shardings(state, mesh, rules)
    placed = jax.tree.map(lambda v, s: jax.device_put(v.get_value(), s), state, shardings, is_leaf=_is_param)
    nnx.update(model, placed)
    return model


def _device_order(sharding) -> list:
    if isinstance(sharding, NamedSharding):
        return list(sharding.mesh.devices.flat)
    return sorted(sharding.device_set, key=lambda d: d.id)


def _identity(x):
    return x


def reshard(tree: Any, shardings: Any) -> Any:
    """`tree` moved to `shardings` device to device, never through the host.

    This is how parameters go from the trainer's layout (e.g. FSDP) to the
    sampler's (e.g. data x tensor). A jitted identity with `out_shardings`
    lets XLA move the shards with collectives, one array at a time (so at
    most one array is ever gathered whole); `jax.device_put` alone copies
    through host memory whenever the new layout needs shards that no device
    holds yet (jax 0.10, `shard_sharded_device_array_slow_path`). Onto other
    devices (or the same ones in another order) of the same number, each
    array is first laid out like its target on its own devices, then every
    shard is copied to its target device.
    """
    leaves, treedef = jax.tree.flatten(tree)
    out = []
    for x, s in zip(leaves, treedef.flatten_up_to(shardings)):
        src = _device_order(x.sharding)
        if _device_order(s) == src:
            out.append(jax.jit(_identity, out_shardings=s)(x))
            continue
        if not isinstance(s, NamedSharding) or s.mesh.size != len(src):
            raise ValueError(
                f"reshard onto other devices needs a NamedSharding over {len(src)} devices, got {s}"
            )
        here = NamedSharding(
            Mesh(np.array(src, dtype=object).reshape(s.mesh.devices.shape), s.mesh.axis_names), s.spec
        )
        out.append(jax.device_put(jax.jit(_identity, out_shardings=here)(x), s))
    return jax.tree.unflatten(treedef, out)


def process_local_mesh(mesh: Mesh) -> tuple[Mesh, Mesh]:
    """(staging, local) meshes for per-process copies of arrays laid out on `mesh`.

    `mesh` (axes `MESH_AXES`) spans several processes, each owning a
    contiguous block of its devices (as `make_mesh` arranges them).
    `staging` has the same devices in the same order arranged
    `("process", *MESH_AXES)`, one row per process; `local` is this process's
    row as a plain `MESH_AXES` mesh. An array placed on `staging` with a spec
    that leaves `process` out is replicated per process, and its addressable
    shards form an array on `local` (see `to_local`).
    """
    devices = list(mesh.devices.flat)
    owners = [d.process_index for d in devices]
    blocks = [p for i, p in enumerate(owners) if i == 0 or p != owners[i - 1]]
    if len(blocks) != len(set(blocks)) or len(devices) % len(blocks):
        raise ValueError("a process-local mesh needs each process's devices contiguous and equal in number")
    per = len(devices) // len(blocks)
    tensor = math.gcd(mesh.shape["tensor"], per)
    grid = np.array(devices, dtype=object).reshape(len(blocks), per // tensor, 1, tensor)
    staging = Mesh(grid, ("process",) + MESH_AXES)
    return staging, Mesh(grid[blocks.index(jax.process_index())], MESH_AXES)


def to_local(tree: Any, local_specs: Any, staging: Mesh, local: Mesh) -> Any:
    """Per-process copies of global arrays: all-gather over processes on device
    (`reshard` to `staging`), then re-wrap this process's buffers as arrays on `local`."""
    staged = reshard(
        tree,
        jax.tree.map(lambda s: NamedSharding(staging, s), local_specs, is_leaf=lambda x: isinstance(x, P)),
    )

    def wrap(a, spec):
        sharding = NamedSharding(local, spec)
        bufs = {sh.device: sh.data for sh in a.addressable_shards}
        return jax.make_array_from_single_device_arrays(
            a.shape, sharding, [bufs[d] for d in sharding.addressable_devices_indices_map(a.shape)]
        )

    return jax.tree.map(wrap, staged, local_specs, is_leaf=lambda x: isinstance(x, P))


def batch_sharding(mesh: Mesh, ndim: int = 2, rules: LogicalRules | None = None) -> NamedSharding:
    """Sharding of a `[B, ...]` activation / token array: batch over `("data", "fsdp")`."""
    return NamedSharding(mesh, logical_to_spec(("batch",) + (None,) * (ndim - 1), None, mesh, rules))
