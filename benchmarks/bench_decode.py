"""Decode step against the accelerator's bandwidth roofline (a GPU measurement; issue 40).

    python benchmarks/bench_decode.py --out /tmp/decode.json --budget 300   # on the GPU
    python benchmarks/bench_decode.py --smoke --out /tmp/decode.json        # tiny shapes on a CPU

A case is one shape (Qwen2.5-0.5B, Qwen2.5-1.5B, Qwen3-8B; random bfloat16 weights) x rows x
variant, decoding with every row at position `--prompt` (1,024) of a `--prompt + --new` cache.

- "model" variants time the decoder's own one-token step (`extend_step`, greedy, the accelerator's
  cache layout) in a `fori_loop` of `--steps` steps: a known trip count, so no host round trip per
  step. Variants: the weights as stored, the fused q/k/v and gate/up layout (`fuse`), cuDNN's
  attention, 4 LoRA adapters (rank 16, all seven projections, rows spread over them).
- "engine" times the sampler's `generate` (its early-exit `while_loop`, sampling tail and
  bookkeeping included) at the same shape: engine minus model is what the engine adds per step.

Roofline per step = (weight bytes + live KV bytes) / the copy bandwidth measured in the same
process (`bench_peak.bandwidth`, read + write); live KV bytes count each row's actual length, not
the cache's capacity. `roofline_share` = roofline seconds / measured seconds.

The JSON is rewritten after every case (a run killed at its limit keeps what it measured); a case
that fails (out of memory) is recorded with its error, and a case is skipped when less than its
expected time is left of `--budget`.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_mfu  # noqa: E402
import bench_peak  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

from marljax.models.config import ModelConfig  # noqa: E402
from marljax.models.decode import decode_weights, default_layout, extend_step, init_decode_cache  # noqa: E402
from marljax.models.decoder import get_params, init_model  # noqa: E402
from marljax.models.lora import LoraSpec, init_adapter, stack_adapters  # noqa: E402
from marljax.sampler.sampling import argmax_first  # noqa: E402

# HF config values of Qwen3-8B
QWEN3_8B = dict(
    model_type="qwen3",
    vocab_size=151936,
    hidden_size=4096,
    intermediate_size=12288,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40960,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)
SHAPES = {
    "qwen2.5-0.5b": {**bench_mfu.SHAPES["qwen2.5-0.5b"], "model_type": "qwen2"},
    "qwen2.5-1.5b": {**bench_mfu.SHAPES["qwen2.5-1.5b"], "model_type": "qwen2"},
    "qwen3-8b": QWEN3_8B,
    "smoke": {**bench_mfu.SHAPES["smoke"], "model_type": "qwen2"},
}
# (kind, shape, rows, variant), most important first: the roofline targets at 64 rows,
# the engine's overhead, adapters, then the anchor comparison (8B, 256 rows) and the other rows
CASES = [
    ("model", "qwen2.5-0.5b", 64, "base"),
    ("model", "qwen2.5-0.5b", 64, "fuse"),
    ("model", "qwen2.5-0.5b", 16, "base"),
    ("model", "qwen2.5-1.5b", 64, "base"),
    ("engine", "qwen2.5-0.5b", 64, "base"),
    ("model", "qwen2.5-0.5b", 64, "adapters4"),
    ("model", "qwen2.5-0.5b", 64, "cudnn"),
    ("model", "qwen3-8b", 64, "base"),
    ("model", "qwen3-8b", 256, "base"),
    ("model", "qwen3-8b", 256, "fuse"),
    ("engine", "qwen3-8b", 256, "base"),
    ("model", "qwen2.5-0.5b", 256, "base"),
    ("model", "qwen2.5-1.5b", 16, "base"),
    ("model", "qwen2.5-1.5b", 256, "base"),
    ("model", "qwen3-8b", 16, "base"),
]
SMOKE_CASES = [
    ("model", "smoke", 4, "base"),
    ("model", "smoke", 4, "cudnn+f32" if jax.default_backend() == "gpu" else "f32"),
    ("model", "smoke", 4, "fuse"),
    ("model", "smoke", 4, "adapters4"),
    ("engine", "smoke", 4, "base"),
]
EXPECTED_S = {"qwen2.5-0.5b": 30.0, "qwen2.5-1.5b": 40.0, "qwen3-8b": 80.0, "smoke": 5.0}


def model_config(shape: str, variant: str) -> ModelConfig:
    """Variants are `+`-joined: fuse, cudnn, adapters4, f32 (float32 weights, cast in every step,
    as the sampler read a run's float32 master weights before it kept a bfloat16 copy)."""
    parts = variant.split("+")
    return ModelConfig.from_hf(
        dict(SHAPES[shape]),
        dtype="bfloat16",
        param_dtype="float32" if "f32" in parts else "bfloat16",
        attention_impl="cudnn" if "cudnn" in parts else None,
    )


def step_bytes(config: ModelConfig, rows: int, mean_length: float, adapters: int) -> float:
    weights = config.num_params() * 2  # the bfloat16 weights a step needs to read
    if adapters:  # rank-16 A and B of the seven projections, per adapter
        d, f = config.hidden_size, config.intermediate_size
        q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
        per_layer = sum(i + o for i, o in [(d, q), (d, kv), (d, kv), (q, d), (d, f), (d, f), (f, d)])
        weights += adapters * 16 * per_layer * config.num_layers * 2
    kv_bytes = 2 * config.num_layers * rows * mean_length * config.num_kv_heads * config.head_dim * 2
    return weights + kv_bytes


def model_case(config: ModelConfig, rows: int, variant: str, prompt: int, new: int, steps: int) -> dict:
    adapters = 4 if "adapters4" in variant.split("+") else 0
    params = get_params(init_model(config))
    if adapters:
        spec = LoraSpec(rank=16, alpha=32)
        params["lora"] = stack_adapters(
            [(spec, init_adapter(config, spec, jax.random.key(i))) for i in range(adapters)]
        )
    fuse = "fuse" in variant.split("+")
    layout = default_layout()
    weights = jax.jit(functools.partial(decode_weights, config=config, fuse=fuse))(params)
    del params
    kv = init_decode_cache(config, rows, prompt + new, layout=layout)
    adapter = jnp.arange(rows, dtype=jnp.int32) % adapters if adapters else None

    def run(weights, kv, tokens, positions):
        def body(_, carry):
            kv, tokens, positions = carry
            logits, kv = extend_step(
                weights,
                tokens[:, None],
                positions,
                jnp.ones_like(positions),
                kv,
                config=config,
                adapter=adapter,
                layout=layout,
            )
            return kv, argmax_first(logits), positions + 1

        return lax.fori_loop(0, steps, body, (kv, tokens, positions))

    tokens = jnp.zeros((rows,), jnp.int32)
    positions = jnp.full((rows,), prompt, jnp.int32)
    start = time.perf_counter()
    compiled = jax.jit(run, donate_argnums=1).lower(weights, kv, tokens, positions).compile()
    compile_s = time.perf_counter() - start
    state = {"kv": kv}

    def call():
        state["kv"], out, _ = compiled(weights, state["kv"], tokens, positions)
        return out

    seconds = timed(call) / steps
    return {
        "compile_s": compile_s,
        "step_ms": 1e3 * seconds,
        "bytes_per_step": step_bytes(config, rows, prompt + steps / 2, adapters),
    }


def engine_case(config: ModelConfig, rows: int, prompt: int, new: int) -> dict:
    from marljax.sampler import SamplingParams, generate
    from marljax.testing import random_model

    model = random_model(config)
    ids = np.random.default_rng(0).integers(3, config.vocab_size, size=(rows, prompt)).tolist()

    def run(n_new: int) -> float:
        def call():
            return generate(model, ids, SamplingParams(n_new, temperature=0.0), eos_ids=(), seed=0).tokens

        start = time.perf_counter()
        jax.block_until_ready(call())
        compile_and_run = time.perf_counter() - start
        return timed(call, repeats=2), compile_and_run

    (full, first_s), (one, _) = run(new), run(1)
    seconds = (full - one) / (new - 1)  # the decode steps alone: the prefill and first token are `one`
    return {
        "compile_s": first_s,
        "step_ms": 1e3 * seconds,
        "prefill_s": one,
        "bytes_per_step": step_bytes(config, rows, prompt + new / 2, 0),
    }


def timed(fn, repeats: int = 5) -> float:
    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=300.0, help="seconds for all cases")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, for a CPU")
    ap.add_argument("--only", nargs="*", help="shapes to run (default: all)")
    args = ap.parse_args()
    begin = time.perf_counter()
    prompt, new, steps = (16, 8, 4) if args.smoke else (1024, 1024, 32)
    bandwidth = bench_peak.bandwidth(2**24 if args.smoke else 2**30, repeats=5)
    result = {
        "device": jax.devices()[0].device_kind,
        "jax": jax.__version__,
        "prompt": prompt,
        "new": new,
        "copy_bytes_per_s": bandwidth,
        "cases": [],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for kind, shape, rows, variant in SMOKE_CASES if args.smoke else CASES:
        if args.only and shape not in args.only:
            continue
        case = {"kind": kind, "shape": shape, "rows": rows, "variant": variant}
        left = args.budget - (time.perf_counter() - begin)
        if left < EXPECTED_S[shape]:
            case["skipped"] = f"{left:.0f} s of the budget left"
        else:
            try:
                config = model_config(shape, variant)
                if kind == "model":
                    case.update(model_case(config, rows, variant, prompt, new, steps))
                else:
                    # fewer new tokens than the model cases: each engine call runs them all
                    case.update(engine_case(config, rows, prompt, min(new, 64)))
                roofline_s = case["bytes_per_step"] / bandwidth
                case["tokens_per_s"] = rows / (case["step_ms"] / 1e3)
                case["roofline_ms"] = 1e3 * roofline_s
                case["roofline_share"] = roofline_s / (case["step_ms"] / 1e3)
            except Exception as e:  # out of memory, a kernel refusing a shape: record, go on
                case["error"] = repr(e)[:400]
            gc.collect()
        result["cases"].append(case)
        print(json.dumps(case), flush=True)
        out.write_text(json.dumps(result, indent=1))
    result["markdown"] = markdown(result)
    out.write_text(json.dumps(result, indent=1))
    print(result["markdown"])


def markdown(result: dict) -> str:
    lines = [
        "| kind | shape | rows | variant | step ms | roofline ms | share | tokens/s | compile s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in result["cases"]:
        if "step_ms" not in c:
            lines.append(
                f"| {c['kind']} | {c['shape']} | {c['rows']} | {c['variant']} | "
                f"{c.get('error') or c.get('skipped')} | | | | |"
            )
            continue
        lines.append(
            f"| {c['kind']} | {c['shape']} | {c['rows']} | {c['variant']} | {c['step_ms']:.3f} | "
            f"{c['roofline_ms']:.3f} | {100 * c['roofline_share']:.0f}% | {c['tokens_per_s']:,.0f} | "
            f"{c['compile_s']:.1f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
