"""Logical axis names, the one rule table mapping them to mesh axes, meshes.

Every parameter carries `logical_axes` metadata (a tuple of names below, one
per dimension). `LOGICAL_AXIS_RULES` maps each name to a mesh axis of the
three-axis mesh `("data", "fsdp", "tensor")`:

- `vocab`, `q_heads`, `kv_heads`, `mlp` -> `tensor` (Megatron-style splits)
- `embed` -> `fsdp` (parameters gathered per layer, ZeRO-3 style)
- `batch` (activations, caches) -> `("data", "fsdp")`
- activations: `act_heads`, `act_kv_heads`, `act_mlp`, `act_vocab` -> `tensor`; their
  `act_embed` (the residual stream's width) and `seq` replicated
- everything else replicated.

Activations. Parameters alone do not decide how XLA splits the activations: with `embed` on
`fsdp`, the partitioner may keep the weights split and replicate every activation of the global
batch (all-reducing partial sums). So the model pins its activations with `constrain(x, axes)`
at layer boundaries, inside attention and the MLP and at the log-prob head. It acts only inside
`activation_sharding(mesh)`, entered by whoever traces a program for a mesh (the update step,
the sampler's programs); elsewhere it returns `x` unchanged.

A dimension whose size does not divide the mesh axis (e.g. one kv head on
`tensor=2`) is replicated instead of failing, so one rule table serves every
model size.

This module knows no model: specs are computed over any pytree of parameters
that carry `logical_axes`. The decoder's own helpers (`param_dict_shardings`,
`cache_sharding`) live in `marljax.models.decoder`, which imports this one.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import math
from collections.abc import Iterator, Mapping, Sequence
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
    "act_embed": None,
    "act_heads": "tensor",
    "act_kv_heads": "tensor",
    "act_mlp": "tensor",
    "act_vocab": "tensor",
}


def make_mesh(
    data: int = 1,
    fsdp: int = 1,
    tensor: int = 1,
    devices: Sequence[Any] | None = None,
    *,
    dcn: Mapping[str, int] | None = None,
) -> Mesh:
    """A `Mesh` with axis names `MESH_AXES`: `data`, `fsdp`, `tensor` devices inside one slice
    (ICI), times `dcn` (e.g. `{"data": 2}`) across slices, so each axis has size ici x dcn.

    Uses the first `data * fsdp * tensor * prod(dcn)` of `devices` (default `jax.devices()`;
    abstract devices of a TPU topology work too). The order comes from `jax.experimental.mesh_utils`
    (`mesh_device_grid`): on TPU it follows the ICI torus, with `tensor` the fastest-varying axis
    (nearest chips); on CPU the devices keep their listed order. With `dcn`, each slice (each
    process where devices carry no `slice_index`) fills one block of the mesh, so only the `dcn`
    axes' collectives cross the slower data-centre network.
    """
    ici = {"data": data, "fsdp": fsdp, "tensor": tensor}
    dcn = dict(dcn or {})
    unknown = sorted(set(dcn) - set(MESH_AXES))
    if unknown:
        raise ValueError(f"dcn axes {unknown} are not mesh axes {MESH_AXES}")
    for where, sizes in (("mesh axis", ici), ("dcn axis", dcn)):
        for name, size in sizes.items():
            if not isinstance(size, int) or size < 1:
                raise ValueError(f"{where} {name!r} must be a positive int, got {size!r}")
    ici_shape = tuple(ici[a] for a in MESH_AXES)
    dcn_shape = tuple(dcn.get(a, 1) for a in MESH_AXES)
    devices = list(jax.devices() if devices is None else devices)
    n = math.prod(ici_shape) * math.prod(dcn_shape)
    if n > len(devices):
        shown = " x ".join(f"{a}={s}" for a, s in ici.items())
        shown += "".join(f" x dcn {a}={s}" for a, s in dcn.items())
        raise ValueError(f"mesh {shown} needs {n} devices, only {len(devices)} available")
    return Mesh(mesh_device_grid(ici_shape, dcn_shape, devices[:n]), MESH_AXES)


def mesh_device_grid(
    ici_shape: Sequence[int], dcn_shape: Sequence[int], devices: Sequence[Any]
) -> np.ndarray:
    """`devices` arranged in an array of shape `ici_shape * dcn_shape` (elementwise) by
    `mesh_utils.create_device_mesh` (one slice) or `create_hybrid_device_mesh` (several: one
    block per slice; per process off TPU, unless the devices are on several slices). A TPU
    shape that the torus cannot hold without splitting a physical axis is split
    (`allow_split_physical_axes`), and one it cannot hold at all (e.g. devices that are no
    whole box of chips) keeps the listed order, with a warning."""
    from jax.experimental import mesh_utils

    if math.prod(dcn_shape) == 1:
        build = functools.partial(mesh_utils.create_device_mesh, ici_shape, devices)
    else:
        slices = {getattr(d, "slice_index", None) for d in devices}
        by_slice = None not in slices and (len(slices) > 1 or devices[0].platform == "tpu")
        build = functools.partial(
            mesh_utils.create_hybrid_device_mesh,
            ici_shape,
            dcn_shape,
            devices,
            process_is_granule=not by_slice,
        )
        granules = {d.slice_index if by_slice else d.process_index for d in devices}
        if len(granules) != math.prod(dcn_shape):
            unit = "slices" if by_slice else "processes"
            raise ValueError(
                f"dcn shape {tuple(dcn_shape)} needs {math.prod(dcn_shape)} {unit}, "
                f"the devices are on {len(granules)}"
            )
    try:
        return build()
    except (ValueError, NotImplementedError, AssertionError):
        pass
    try:
        return build(allow_split_physical_axes=True)
    except (ValueError, NotImplementedError, AssertionError) as err:
        if math.prod(dcn_shape) > 1:
            raise
        logging.getLogger(__name__).warning(
            "mesh %s: no topology-aware device order (%s); using the devices in listed order", ici_shape, err
        )
        return np.array(devices, dtype=object).reshape(ici_shape)


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


def mesh_platform(mesh: Mesh | None) -> str:
    """The backend `mesh`'s devices are (cpu, gpu, tpu); without a mesh, JAX's default backend."""
    return jax.default_backend() if mesh is None else mesh.devices.flat[0].platform


def process_local_mesh(mesh: Mesh) -> tuple[Mesh, Mesh]:
    """(staging, local) meshes for per-process copies of arrays laid out on `mesh`.

    `mesh` (axes `MESH_AXES`) spans several processes, each owning the same
    number of its devices, in any order (a topology-aware TPU mesh interleaves
    hosts). `staging` has the same devices grouped by process, in mesh order
    within each, arranged `("process", *MESH_AXES)`, one row per process;
    `local` is this process's row as a plain `MESH_AXES` mesh. An array placed
    on `staging` with a spec that leaves `process` out is replicated per
    process, and its addressable shards form an array on `local` (see `to_local`).
    """
    blocks = list(dict.fromkeys(d.process_index for d in mesh.devices.flat))
    devices = [d for p in blocks for d in mesh.devices.flat if d.process_index == p]
    if len(devices) % len(blocks) or any(
        sum(d.process_index == p for d in devices) != len(devices) // len(blocks) for p in blocks
    ):
        raise ValueError("a process-local mesh needs the same number of devices of every process")
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


_ACTIVATION_MESH: contextvars.ContextVar[tuple[Mesh, LogicalRules | None] | None] = contextvars.ContextVar(
    "activation_mesh", default=None
)


@contextlib.contextmanager
def activation_sharding(mesh: Mesh | None, rules: LogicalRules | None = None) -> Iterator[None]:
    """While tracing inside this block, `constrain` pins activations to `mesh` by `rules`.
    A None or one-device mesh turns the constraints off."""
    token = _ACTIVATION_MESH.set(None if mesh is None or mesh.size == 1 else (mesh, rules))
    try:
        yield
    finally:
        _ACTIVATION_MESH.reset(token)


def current_activation_mesh() -> tuple[Mesh, LogicalRules | None] | None:
    """`(mesh, rules)` of the enclosing `activation_sharding`, or None outside one (or for a
    one-device mesh): for code that must place work by hand (a kernel under `shard_map`)."""
    return _ACTIVATION_MESH.get()


def constrain(x: jax.Array, logical_axes: Sequence[str | None]) -> jax.Array:
    """`x` constrained to the sharding of its `logical_axes` (one name per dimension) on the mesh
    of the enclosing `activation_sharding`; `x` itself outside one."""
    current = _ACTIVATION_MESH.get()
    if current is None:
        return x
    mesh, rules = current
    spec = logical_to_spec(logical_axes, x.shape, mesh, rules)
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))
