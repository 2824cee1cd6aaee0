"""This machine's limits, measured: matmul FLOP/s (float32, bfloat16) and memory bandwidth.

    python benchmarks/bench_peak.py [--quick]

Matmul: `jnp.dot` of two random square matrices under `jax.jit` on JAX's
default backend, 2 n^3 FLOPs per call, best of `repeats` calls at each size;
the peak is the best size. Bandwidth: `x * 2` over a large float32 array
(one read and one write of every byte), best of `repeats`. Other benchmarks
report their achieved FLOP/s (or bytes/s) as a fraction of these numbers.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp


def best_seconds(fn, *args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))  # compile and warm up
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t)
    return best


def matmul_flops(n: int, dtype, repeats: int) -> float:
    ka, kb = jax.random.split(jax.random.key(0))
    a = jax.random.normal(ka, (n, n), jnp.float32).astype(dtype)
    b = jax.random.normal(kb, (n, n), jnp.float32).astype(dtype)
    return 2 * n**3 / best_seconds(jax.jit(jnp.dot), a, b, repeats=repeats)


def bandwidth(n_bytes: int, repeats: int) -> float:
    x = jnp.ones((n_bytes // 4,), jnp.float32)
    return 2 * n_bytes / best_seconds(jax.jit(lambda v: v * 2), x, repeats=repeats)


def run(mode: str = "full") -> dict:
    gpu = jax.default_backend() != "cpu"
    sizes = {"smoke": [256, 512], "quick": [1024, 2048], "full": [1024, 2048, 4096]}[mode]
    if gpu and mode != "smoke":
        sizes = [4096, 8192, 16384]
    repeats = 2 if mode == "smoke" else 5
    out = {"backend": jax.default_backend(), "device": str(jax.devices()[0].device_kind), "matmul": {}}
    for dtype in ("float32", "bfloat16"):
        by_size = {n: matmul_flops(n, jnp.dtype(dtype), repeats) for n in sizes}
        out["matmul"][dtype] = {"by_size": by_size, "peak_flops": max(by_size.values())}
    n_bytes = (1 << 24) if mode == "smoke" else (1 << 30 if gpu else 1 << 28)
    out["bandwidth_bytes_per_s"] = bandwidth(n_bytes, repeats)
    out["peak_flops"] = {k: v["peak_flops"] for k, v in out["matmul"].items()}
    rows = [
        "| dtype | " + " | ".join(f"n={n}" for n in sizes) + " | peak |",
        "|---|" + "---|" * (len(sizes) + 1),
    ]
    for dtype, v in out["matmul"].items():
        rows.append(
            f"| {dtype} | "
            + " | ".join(f"{f / 1e9:,.0f}" for f in v["by_size"].values())
            + f" | **{v['peak_flops'] / 1e9:,.0f}** |"
        )
    out["markdown"] = (
        f"`jnp.dot` of n x n matrices on {out['backend']} ({out['device']}), GFLOP/s "
        f"(2 n^3 per call, best of {repeats}):\n\n"
        + "\n".join(rows)
        + f"\n\nMemory bandwidth (`x * 2` over {n_bytes >> 20} MiB, read + write): "
        f"{out['bandwidth_bytes_per_s'] / 1e9:,.1f} GB/s."
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    out = run("quick" if args.quick else "full")
    print(out.pop("markdown"))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
