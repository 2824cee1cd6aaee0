"""The logical-axis rule table, meshes, and sharded == single-device numerics."""

from __future__ import annotations

import ast
from pathlib import Path

import jax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from marljax.models import logical_to_spec, make_mesh, param_specs
from marljax.testing import random_model


class _FakeMesh:
    """Only `.shape` is read by logical_to_spec."""

    def __init__(self, **shape):
        self.shape = shape


def test_rule_table_hand_values():
    mesh = _FakeMesh(data=1, fsdp=4, tensor=2)
    assert logical_to_spec(("layers", "embed", "q_heads", "head_dim"), (2, 64, 4, 16), mesh) == P(
        None, "fsdp", "tensor"
    )
    assert logical_to_spec(("vocab", "embed"), (512, 64), mesh) == P("tensor", "fsdp")
    assert logical_to_spec(("layers", "mlp", "embed"), (2, 128, 64), mesh) == P(None, "tensor", "fsdp")
    # a dimension that the mesh axis does not divide is replicated (1 kv head on tensor=2)
    assert logical_to_spec(("layers", "embed", "kv_heads", "head_dim"), (2, 64, 1, 16), mesh) == P(
        None, "fsdp"
    )
    # batch goes over data and fsdp; size-1 mesh axes are dropped
    assert logical_to_spec(("batch", "seq"), (8, 3), _FakeMesh(data=2, fsdp=4, tensor=1)) == P(
        ("data", "fsdp")
    )
    assert logical_to_spec(("batch", "seq"), (8, 3), mesh) == P("fsdp")
    # without a mesh: the raw rule
    assert logical_to_spec(("embed", "mlp")) == P("fsdp", "tensor")
    with pytest.raises(ValueError, match="'nonsense'"):
        logical_to_spec(("nonsense",))


def test_every_parameter_has_logical_axes():
    for preset in ("tiny-qwen2", "tiny-qwen3", "tiny-llama"):
        model = random_model(preset)
        state = nnx.state(model)
        specs = jax.tree.leaves(
            param_specs(state, _FakeMesh(data=1, fsdp=2, tensor=2)), is_leaf=lambda x: isinstance(x, P)
        )
        assert len(specs) == len(jax.tree.leaves(state)) > 10


def test_sharding_module_imports_no_model():
    """sharding.py is a leaf (rules and specs over any pytree): the decoder imports it, never
    the other way round, so there is no import cycle to hide inside functions."""
    import marljax.models.sharding as sharding

    tree = ast.parse(Path(sharding.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in imported if m and m.startswith("marljax")}, imported


def test_make_mesh_shapes_and_errors():
    mesh = make_mesh()
    assert mesh.axis_names == ("data", "fsdp", "tensor") and mesh.devices.shape == (1, 1, 1)
    with pytest.raises(ValueError, match="needs 64 devices"):
        make_mesh(fsdp=8, tensor=8)
    with pytest.raises(ValueError, match="'tensor'"):
        make_mesh(tensor=0)


@pytest.mark.slow
def test_eight_device_fsdp_tensor_sharding_matches_single_device(run_on_fake_devices):
    proc = run_on_fake_devices(str(Path(__file__).with_name("_sharded_check.py")))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "tiny-qwen3 fsdp=4 tensor=2: OK" in proc.stdout
