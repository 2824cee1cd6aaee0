"""How many kernels one decode step launches, counted in the program compiled ahead of time for a
TPU (libtpu, no chip): a regression guard for the sampler's speed (issue 40). A decode step of a
small model is a few hundred small kernels, each a few microseconds, so their number, not the
bytes read, sets the step time below the bandwidth roofline.

Counted: the instructions of the decode loop's body that run as their own kernel (fusions, copies,
reductions, dynamic updates, ...), not tuple plumbing, constants or parameters, and not the
asynchronous copy-start/copy-done pairs that prefetch weights into on-chip memory. Per layer = the
3-layer program's count minus the 2-layer one's; outside the layers = the rest (sampling tail and
bookkeeping). The bounds are today's counts (23 per layer, 71 outside with top-p/top-k; with four
LoRA adapters on every projection, rows of different adapters in one batch, 35 and 72): lower them
when a change fuses more.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from tpu_target import needs_libtpu

from marljax.models.config import ModelConfig
from marljax.models.decoder import get_params, init_model
from marljax.models.lora import LoraSpec, init_adapter, stack_adapters
from marljax.sampler.engine import Engine

# adapters -> (kernels per layer, outside the layers) at most
BOUNDS = {0: (23, 71), 4: (35, 72)}
# not kernels: plumbing, and the weight prefetches the TPU overlaps with compute
NOT_KERNELS = {
    "parameter",
    "get-tuple-element",
    "tuple",
    "bitcast",
    "constant",
    "after-all",
    "partition-id",
    "replica-id",
    "opt-barrier",
    "copy-start",
    "copy-done",
}


pytestmark = needs_libtpu


def computations(hlo: str) -> dict[str, list[str]]:
    """Each computation's instruction lines, by name, from compiled HLO text."""
    out, current = {}, None
    for line in hlo.splitlines():
        head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$", line)
        if head:
            current = out.setdefault(head.group(1), [])
        elif line.strip() == "}":
            current = None
        elif current is not None and " = " in line:
            current.append(line.strip())
    return out


def opcode(instruction: str) -> str:
    # after the result's type (a shape, or a tuple of them: dtypes are followed by '[', layout
    # tiles T(..) and memory spaces S(..) are upper case), the first lower-case word before '('
    return re.search(r"(?:^|[\s)}\]])([a-z][a-z0-9\-]*)\(", instruction.split(" = ", 1)[1]).group(1)


def kernels_per_step(hlo: str) -> int:
    """Kernels in the body of the decode loop (the while loop with the most of them)."""
    comps = computations(hlo)
    nested = {
        m for lines in comps.values() for line in lines for m in re.findall(r"calls=%?([\w.\-]+)", line)
    }
    nested |= {
        m for lines in comps.values() for line in lines for m in re.findall(r"to_apply=%?([\w.\-]+)", line)
    }
    bodies = {m for lines in comps.values() for line in lines for m in re.findall(r"body=%?([\w.\-]+)", line)}
    counts = [sum(1 for line in comps[name] if opcode(line) not in NOT_KERNELS) for name in bodies - nested]
    return max(counts)


def decode_program(layers: int, adapters: int = 0) -> str:
    """The engine's decode loop for a `layers`-deep Qwen2.5-0.5B (real width and vocabulary),
    bfloat16, 16 slots, sampling with top-p/top-k, compiled for one TPU v5p chip; with `adapters`
    rank-8 LoRA adapters on every projection (`params["lora"]`, each row its own)."""
    from jax.experimental import topologies

    from marljax.train.abstract_inputs import abstract_tables

    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    device = topologies.get_topology_desc("v5p:2x2x1", "tpu").devices[0]
    mesh = Mesh([device], ("data",))
    config = ModelConfig.preset("qwen2.5-0.5b", dtype="bfloat16", param_dtype="bfloat16")
    config = dataclasses.replace(config, num_layers=layers)
    engine = Engine(config, mesh=mesh, cache_layout="bskh")

    def abstract(tree):
        one = NamedSharding(mesh, P())
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one), tree)

    def params():
        p = get_params(init_model(config))
        if adapters:
            spec = LoraSpec(rank=8, alpha=16.0)
            p["lora"] = stack_adapters(
                [(spec, init_adapter(config, spec, jax.random.key(i))) for i in range(adapters)]
            )
        return p

    weights = abstract(jax.eval_shape(params))
    state = abstract(jax.eval_shape(functools.partial(engine._empty, slots=16, capacity=256, stop_len=1)))
    scalar = abstract(jax.ShapeDtypeStruct((), jnp.int32))
    lowered = engine._decode_jit.lower(
        weights,
        state,
        abstract(abstract_tables(engine.buckets)),
        scalar,
        scalar,
        windows=(256,),
        chunk=8,
        greedy=False,
        truncate=True,
        want_sampling_lp=True,
        pad_id=0,
    )
    return lowered.compile().as_text()


def test_the_counter_reads_tpu_hlo():
    hlo = """%body (arg: (s32[], bf16[4]{0:T(128)})) -> (s32[], bf16[4]) {
  %arg = (s32[]{:T(128)}, bf16[4]{0:T(128)}) parameter(0)
  %a = s32[]{:T(128)} get-tuple-element(%arg), index=0
  %c = (bf16[4]{0:T(128)}, bf16[4]{0:T(128)S(1)}, u32[]{:S(2)}) copy-start(%b)
  %f = bf16[4]{0:T(128)} fusion(%b), kind=kLoop, calls=%fused
  %s = bf16[4]{0:T(128)} dynamic-update-slice(%f, %f, %a)
  ROOT %t = (s32[], bf16[4]) tuple(%a, %s)
}

%fused (p: bf16[4]) -> bf16[4] {
  %p = bf16[4]{0} parameter(0)
  %m = bf16[4]{0} multiply(%p, %p)
  %n = bf16[4]{0} negate(%m)
}

ENTRY %main (x: bf16[4]) -> bf16[4] {
  %w = (s32[], bf16[4]) while(%i), condition=%cond, body=%body
}
"""
    assert kernels_per_step(hlo) == 2  # the fusion and the dynamic-update-slice


@pytest.mark.slow(seconds=50)
@pytest.mark.parametrize("adapters", sorted(BOUNDS))
def test_a_decode_step_launches_no_more_kernels_than_today(adapters):
    two, three = (kernels_per_step(decode_program(layers, adapters)) for layers in (2, 3))
    per_layer, outside = three - two, two - 2 * (three - two)
    print(
        f"kernels per decode step, {adapters} adapters: {per_layer} per layer, {outside} outside the layers"
    )
    per_layer_max, outside_max = BOUNDS[adapters]
    assert 0 < per_layer <= per_layer_max, per_layer
    assert 0 < outside <= outside_max, outside
