"""GPU section: Qwen2.5-0.5B-shaped bfloat16 train-step MFU and decode tokens/s against the
HBM-bandwidth roofline.

    python benchmarks/run.py --gpu          (needs a jax CUDA/TPU backend; torch side if torch.cuda)

GPU set-up: a CUDA build of jaxlib (JAX's install guide, e.g. `pip install "jax[cuda12]"`); for the
transformers side a CUDA build of torch.

- Train step: `bench_train.measure("qwen2.5-0.5b")` (8 x 1024 tokens, bfloat16 compute,
  float32 master weights; transformers under `torch.autocast` when torch sees CUDA);
  MFU = achieved FLOP/s / the bfloat16 matmul peak `bench_peak` measured on the device.
- Decode: marljax `generate`, greedy, random Qwen2.5-0.5B-shaped weights in bfloat16,
  prompt 128, batches 1 / 16 / 64. Decode rate = B (new - 1) / (t(new) - t(1)) (prefill
  cancels). Roofline: every decode step reads all weights and the filled KV cache once,
  so tokens/s <= B x bandwidth / (weight bytes + KV bytes at the mean length), with the
  bandwidth `bench_peak` measured (`x * 2` over 1 GiB).

On a CPU backend this section is skipped, except in smoke mode, which runs the same code
on a tiny config so that the path stays tested.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_train  # noqa: E402


def decode_rate(config, batch: int, prompt: int, new: int, repeats: int) -> dict:
    import jax
    import numpy as np

    from marljax.sampler import SamplingParams, generate
    from marljax.testing import random_model

    model = random_model(config)
    ids = np.random.default_rng(0).integers(3, config.vocab_size, size=(batch, prompt)).tolist()

    def seconds(n_new: int) -> float:
        def call():
            return jax.block_until_ready(
                generate(model, ids, SamplingParams(n_new, temperature=0.0), eos_ids=(), seed=0).tokens
            )

        call()
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            call()
            best = min(best, time.perf_counter() - t)
        return best

    t_new, t_one = seconds(new), seconds(1)
    tokens_per_s = batch * (new - 1) / max(t_new - t_one, 1e-9)
    weight_bytes = config.num_params() * np.dtype(config.param_dtype).itemsize
    mean_len = prompt + new / 2
    kv_bytes = (
        2
        * config.num_layers
        * batch
        * mean_len
        * config.num_kv_heads
        * config.head_dim
        * np.dtype(config.dtype).itemsize
    )
    return {
        "batch": batch,
        "prompt": prompt,
        "new_tokens": new,
        "seconds": t_new,
        "prefill_seconds": t_one,
        "decode_tokens_per_s": tokens_per_s,
        "bytes_per_step": weight_bytes + kv_bytes,
    }


def run(mode: str = "full", peak: dict | None = None) -> dict:
    import jax

    from marljax.models.config import ModelConfig

    on_gpu = jax.default_backend() != "cpu"
    if not on_gpu and mode != "smoke":
        return {
            "skipped": f"no accelerator (jax backend {jax.default_backend()!r})",
            "markdown": "Skipped: no GPU on this machine (jax backend cpu).",
        }
    import torch

    peak = peak or {}
    size = "qwen2.5-0.5b" if on_gpu else "smoke"
    # never a GPU against torch on CPU (a CPU-only torch wheel would take minutes per 0.5B step)
    train = bench_train.measure(
        size, repeats=2 if mode == "smoke" else 5, torch_side=not on_gpu or torch.cuda.is_available()
    )
    dtype_peak = peak.get("peak_flops", {}).get(train["dtype"])
    for lib in ("marljax", "marljax_scan", "transformers"):
        if lib in train and dtype_peak:
            train[lib]["mfu"] = train[lib]["flops_per_s"] / dtype_peak
    if on_gpu:
        cfg = ModelConfig.preset("qwen2.5-0.5b", dtype="bfloat16", param_dtype="bfloat16")
        shapes = [(1, 128, 256), (16, 128, 256), (64, 128, 256)]
    else:
        cfg = ModelConfig.preset("tiny-qwen3")
        shapes = [(2, 8, 8)]
    bw = peak.get("bandwidth_bytes_per_s")
    decode = []
    for b, p, n in shapes:
        d = decode_rate(cfg, b, p, n, repeats=1 if mode == "smoke" else 3)
        if bw:
            d["roofline_tokens_per_s"] = b * bw / d["bytes_per_step"]
            d["fraction_of_roofline"] = d["decode_tokens_per_s"] / d["roofline_tokens_per_s"]
        decode.append(d)
    lines = [
        f"Train step ({size}, {train['dtype']}, {train['batch']} x {train['seq_len']}): marljax "
        f"{train['marljax']['tokens_per_s']:,.0f} tokens/s with the layers unrolled "
        f"({train['marljax_scan']['tokens_per_s']:,.0f} under `lax.scan`)"
        + (
            f", MFU {100 * train['marljax']['mfu']:.0f}% of the measured {train['dtype']} matmul peak"
            if "mfu" in train["marljax"]
            else ""
        )
        + (
            f"; transformers {train['transformers']['tokens_per_s']:,.0f} tokens/s "
            f"(marljax {train['speedup']:.2f}x)"
            if "transformers" in train
            else ""
        )
        + ".\n",
        "| batch | prompt | new | decode tokens/s | roofline tokens/s | fraction |",
        "|---|---|---|---|---|---|",
    ]
    for d in decode:
        roof = d.get("roofline_tokens_per_s")
        lines.append(
            f"| {d['batch']} | {d['prompt']} | {d['new_tokens']} | {d['decode_tokens_per_s']:,.0f} | "
            + (f"{roof:,.0f} | {100 * d['fraction_of_roofline']:.0f}% |" if roof else "- | - |")
        )
    return {
        "device": str(jax.devices()[0].device_kind),
        "train": train,
        "decode": decode,
        "markdown": "\n".join(lines),
    }
