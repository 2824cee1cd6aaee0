"""Meshes that fit the hardware: `make_mesh` orders TPU devices along the ICI torus (abstract
devices of a topology, compiled ahead of time on this CPU through libtpu), builds multislice
meshes with one block per slice, keeps CPU devices in their listed order, and a sharded step on
a two-slice mesh sends over the data-centre network (DCN) only what its DCN axis implies."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

pytest.importorskip("libtpu", reason="compiling for TPU topologies on a CPU needs libtpu")
# libtpu's single-process lock file would make this fail while another process on the machine
# (a concurrent test run) holds libtpu; compile-only topologies never open a chip
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from marljax.models.sharding import make_mesh  # noqa: E402


def topology(name: str, num_slices: int = 1) -> list:
    from jax.experimental import topologies

    return topologies.get_topology_desc(name, "tpu", num_slices=num_slices).devices


def on_one_line(group) -> bool:
    """True when the devices differ in exactly one physical coordinate, each value once."""
    coords = np.array([d.coords for d in group])
    varying = [k for k in range(coords.shape[1]) if len(set(coords[:, k])) > 1]
    return len(varying) == 1 and len(set(coords[:, varying[0]])) == len(group)


def groups_along(grid: np.ndarray, axis: int) -> list:
    return list(np.moveaxis(grid, axis, -1).reshape(-1, grid.shape[axis]))


def test_tpu_mesh_axes_follow_the_torus():
    devices = topology("v5p:4x4x4")  # 64 chips, 16 hosts of 2x2x1 chips: jax lists them host by host
    mesh = make_mesh(4, 4, 4, devices=devices)
    assert mesh.axis_names == ("data", "fsdp", "tensor") and mesh.devices.shape == (4, 4, 4)
    assert sorted(d.id for d in mesh.devices.flat) == sorted(d.id for d in devices)
    for axis in range(3):  # every group along every mesh axis is one ring of the torus
        assert all(on_one_line(g) for g in groups_along(mesh.devices, axis)), axis
    # the listed order would put each tensor group on a 2x2 square of one host instead
    listed = np.array(devices, dtype=object).reshape(4, 4, 4)
    assert not any(on_one_line(g) for g in groups_along(listed, 2))


@pytest.mark.parametrize("axis", ["data", "fsdp"])
def test_hybrid_mesh_puts_each_slice_in_one_dcn_block(axis):
    devices = topology("v5p:2x2x2", num_slices=2)  # 2 slices of 8 chips
    mesh = make_mesh(1, 8, 1, devices=devices, dcn={axis: 2})
    want = {"data": (2, 8, 1), "fsdp": (1, 16, 1)}[axis]
    assert tuple(mesh.shape.values()) == want  # each axis: ICI size x DCN size
    slices = np.vectorize(lambda d: d.slice_index)(mesh.devices)
    blocks = [slices[0], slices[1]] if axis == "data" else [slices[:, :8], slices[:, 8:]]
    assert [set(b.flat) for b in blocks] == [{0}, {1}]
    # inside a slice, the devices are ordered as on one slice alone
    one = make_mesh(1, 8, 1, devices=[d for d in devices if d.slice_index == 1])
    assert list(mesh.devices.reshape(2, 8)[1]) == list(one.devices.flat)


def test_dcn_and_devices_checks():
    devices = topology("v5p:2x2x2", num_slices=2)
    with pytest.raises(ValueError, match="dcn axes"):
        make_mesh(1, 8, 1, devices=devices, dcn={"model": 2})
    with pytest.raises(ValueError, match="needs 2 slices, the devices are on 1"):
        make_mesh(1, 4, 1, devices=devices[:8], dcn={"data": 2})
    with pytest.raises(ValueError, match="needs 32 devices"):
        make_mesh(2, 8, 1, devices=devices, dcn={"data": 2})


# ------------------------------------------------------------- collectives of a compiled step
def _fsdp_step(w, x):
    """One SGD step of a linear layer: weights split over fsdp, rows over (data, fsdp)."""

    def loss(w):
        return jnp.sum(jnp.tanh(x @ w) ** 2)

    return w - 0.1 * jax.grad(loss)(w)


def _compiled_hlo(dcn: dict) -> tuple[str, int]:
    mesh = make_mesh(1, 8, 1, devices=topology("v5p:2x2x2", num_slices=2), dcn=dcn)
    w = jax.ShapeDtypeStruct((256, 512), jnp.float32, sharding=NamedSharding(mesh, P("fsdp", None)))
    x = jax.ShapeDtypeStruct((64, 256), jnp.float32, sharding=NamedSharding(mesh, P(("data", "fsdp"), None)))
    compiled = jax.jit(_fsdp_step, out_shardings=w.sharding).lower(w, x).compile()
    return compiled.as_text(), mesh.shape["fsdp"]


def _dcn_transfers(hlo: str) -> list[tuple[str, int]]:
    """(kind, elements) of each cross-slice transfer: XLA lowers a collective over slices to a
    send to the megascale runtime, tagged with the collective it implements."""
    out = []
    for line in hlo.splitlines():
        kind = re.search(r'_xla_megascale_transfer_type="(\w+)"', line)
        if kind and re.search(r"= \(\w+\[([\d,]*)\][^ ]* [^=]*\) send\(", line):
            dims = re.search(r"= \(\w+\[([\d,]*)\]", line).group(1)
            out.append((kind.group(1), int(np.prod([int(d) for d in dims.split(",") if d]))))
    return out


def _ici_groups(hlo: str) -> list[list[int]]:
    groups = []
    for line in hlo.splitlines():
        if re.search(r" (all-gather|all-reduce|reduce-scatter|all-to-all)(-start)?\(", line):
            found = re.search(r"replica_groups=\{(\{[\d,{}]*\})\}", line)
            assert found, f"replica groups in a format this test does not read: {line[:300]}"
            groups += [[int(i) for i in g.split(",")] for g in re.findall(r"\{([\d,]+)\}", found.group(1))]
    return groups


def test_data_over_dcn_sends_only_the_gradient_all_reduce():
    """dcn data=2 (FSDP inside each slice): the weights are gathered over ICI only; across slices
    goes one all-reduce of each device's gradient shard (256 x 512 / 8 elements)."""
    hlo, fsdp = _compiled_hlo({"data": 2})
    assert fsdp == 8
    assert _dcn_transfers(hlo) == [("ALL_REDUCE", 256 * 512 // 8)], _dcn_transfers(hlo)
    groups = _ici_groups(hlo)
    assert groups and all(sorted(g) == list(range(8)) for g in groups), groups  # one slice's 8 chips


def test_fsdp_over_dcn_gathers_weights_across_slices():
    """dcn fsdp=2: the weights are split over both slices, so gathering them crosses the DCN."""
    hlo, fsdp = _compiled_hlo({"fsdp": 2})
    assert fsdp == 16
    # each device's 1/16 of the weights goes to its peer in the other slice
    assert ("ALL_GATHER", 256 * 512 // 16) in _dcn_transfers(hlo), _dcn_transfers(hlo)


# ------------------------------------------------------------------------------ CPU and config
CPU_ORDER = """
import jax, numpy as np
from marljax.models.sharding import make_mesh
devs = jax.devices()
assert len(devs) == 8
assert (make_mesh(2, 2, 2).devices == np.array(devs).reshape(2, 2, 2)).all()
assert (make_mesh(1, 4, 1).devices == np.array(devs[:4]).reshape(1, 4, 1)).all()
picked = [devs[i] for i in (7, 5, 3, 1)]
assert list(make_mesh(1, 2, 2, devices=picked).devices.flat) == picked
try:
    make_mesh(1, 4, 1, dcn={"data": 2})
    raise SystemExit("dcn over one process must fail")
except ValueError as e:
    assert "needs 2 processes, the devices are on 1" in str(e), e
print("cpu order: OK")
"""


def test_cpu_meshes_keep_the_listed_device_order(run_on_fake_devices):
    proc = run_on_fake_devices("-c", CPU_ORDER)
    assert proc.returncode == 0 and "cpu order: OK" in proc.stdout, proc.stdout + proc.stderr[-3000:]


def test_mesh_config_dcn():
    from pydantic import ValidationError

    from marljax.train.config import PolicyConfig

    def policy(mesh):
        return PolicyConfig.model_validate({"model": {"preset": "tiny-qwen3"}, "mesh": mesh})

    cfg = policy({"fsdp": 8, "dcn": {"data": 2}}).mesh
    assert cfg.axis_sizes() == {"data": 2, "fsdp": 8, "tensor": 1}
    assert policy({"fsdp": 4, "dcn": {"fsdp": 2}, "devices": list(range(8))}).mesh.axis_sizes()["fsdp"] == 8
    with pytest.raises(ValidationError, match=r"mesh\.dcn\.tensor"):
        policy({"dcn": {"tensor": 2}})  # tensor parallelism stays inside a slice
    with pytest.raises(ValidationError, match="need data\\*fsdp\\*tensor \\(x dcn\\) = 8 devices"):
        policy({"fsdp": 4, "dcn": {"fsdp": 2}, "devices": [0, 1, 2, 3]})
