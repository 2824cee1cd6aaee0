"""Train step (forward + backward + AdamW) tokens/s: marljax vs transformers + torch.

    python benchmarks/bench_train.py [--quick] [--sizes tiny 50m]

One RL update step of the PPO clipped loss (token-mean, ratio from the
current log-probs) on a batch of B rows x T tokens, then one AdamW step:

- marljax: the trainer's real path, `marljax.train.update.make_update_fn` over
  `rl_loss` (chunked log-probs and entropy from the hidden states, the loss
  kernels, gradient, optax AdamW, non-finite guard), one `jit` with donated
  buffers; batch laid out as `collate` makes it (one micro-batch). Measured
  with the layers unrolled (`model.scan_layers: false`, the faster choice for
  long runs) and, side by side, under `lax.scan` (the default: shorter
  compiles); the ratio to transformers is the unrolled one's.
- transformers: `Qwen3ForCausalLM` (sdpa attention), log-softmax of the
  logits, the same loss, `loss.backward()`, `torch.optim.AdamW`, as one
  writes it with transformers; entropy computed without gradient as a metric.

Same Qwen3 config and the same weights (the torch model is saved and loaded
into marljax; the entropy metric of both is compared before timing). torch
gets as many threads as XLA's CPU client (one per core). Calls alternate
(marljax, torch, marljax, ...), median of `repeats`.

Host memory. XLA:CPU allocates a step's buffers afresh, and with glibc's
defaults every large buffer is a fresh `mmap` that faults its pages in again
(`marljax.host_memory`); marljax's entry points therefore restart with glibc
told to keep freed memory. Outside smoke mode each size is measured twice, in
child processes: with those settings and with glibc's defaults; both sides of a
comparison always share one process and so one allocator setting.

FLOPs per step = tokens x (6 N + 12 L d_attn T) (PaLM's MFU formula): N the
parameters (tied embeddings counted once: the output projection uses them),
L layers, d_attn = heads x head_dim, T the sequence length. Reported as a
fraction of the matmul peak that `bench_peak` measured on this machine.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import child_json, emit_json, fmt, interleaved  # noqa: E402

from marljax.host_memory import default_env, kept_env  # noqa: E402
from marljax.testing.real_shapes import SHAPES as REAL_SHAPES  # noqa: E402

# name -> environment of the child process that measures with it
HOST_MEMORY = {"kept": kept_env, "glibc default": default_env}

_QWEN3 = dict(rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=4096)
# name -> (architecture, HF config keys, batch rows, sequence length, dtype)
SIZES = {
    # the generation benchmark's checkpoint (3.67 M parameters)
    "tiny": (
        "qwen3",
        dict(
            vocab_size=2048,
            hidden_size=256,
            intermediate_size=768,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=64,
            **_QWEN3,
        ),
        8,
        256,
        "float32",
    ),
    # ~51 M parameters
    "50m": (
        "qwen3",
        dict(
            vocab_size=16384,
            hidden_size=512,
            intermediate_size=1792,
            num_hidden_layers=12,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=64,
            **_QWEN3,
        ),
        8,
        256,
        "float32",
    ),
    # GPU only (--gpu): Qwen2.5-0.5B shapes in bfloat16 (float32 master weights on both sides)
    "qwen2.5-0.5b": (
        REAL_SHAPES["qwen2.5-0.5b"][0],
        REAL_SHAPES["qwen2.5-0.5b"][1],
        8,
        1024,
        "bfloat16",
    ),
    "smoke": (
        "qwen3",
        dict(
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            **_QWEN3,
        ),
        2,
        64,
        "float32",
    ),
}
LR, WD, CLIP = 1e-5, 0.01, 0.2


def hf_config(name: str):
    import transformers

    family, keys, *_ = SIZES[name]
    cls = transformers.Qwen3Config if family == "qwen3" else transformers.Qwen2Config
    # no special tokens: a real shape's keys name them, and a benchmark must not stop at one
    return cls(**{**keys, "bos_token_id": None, "eos_token_id": None, "pad_token_id": 0})


def make_batch(vocab: int, B: int, T: int, prompt: int = 32):
    import numpy as np

    rng = np.random.default_rng(0)
    tokens = rng.integers(3, vocab, size=(B, T), dtype=np.int32)
    labels = np.concatenate([tokens[:, 1:], np.zeros((B, 1), np.int32)], axis=1)
    loss_mask = np.zeros((B, T), bool)
    loss_mask[:, prompt - 1 : T - 1] = True
    return dict(
        tokens=tokens,
        labels=labels,
        positions=np.broadcast_to(np.arange(T, dtype=np.int32), (B, T)),
        attention_mask=np.ones((B, T), bool),
        loss_mask=loss_mask,
        sampling_logp=np.zeros((B, T), np.float32),
        advantages=rng.standard_normal(B).astype(np.float32),
        temperature=np.ones(B, np.float32),  # sampled at T = 1, as the torch side computes
    )


def setup_marljax(path: Path, batch: dict, dtype: str, scan_layers: bool = False):
    import jax
    import jax.numpy as jnp
    import optax

    from marljax.models import from_pretrained, get_params
    from marljax.train.config import LossConfig
    from marljax.train.update import make_update_fn, rl_loss

    model, config = from_pretrained(path, dtype=dtype, param_dtype="float32", scan_layers=scan_layers)
    loss = LossConfig(type="ppo", clip_low=CLIP, clip_high=CLIP, agg_mode="token-mean")
    update = make_update_fn(
        functools.partial(rl_loss, config=config, loss=loss, use_old_logp=False),
        optax.adamw(LR, weight_decay=WD),
        loss.agg_mode,
    )
    state = {"params": get_params(model)}
    # committed to the device like the parameters: optax makes its step counter uncommitted, and
    # the update's second call would then compile again (the counter comes back committed)
    state["opt"] = jax.device_put(optax.adamw(LR, weight_decay=WD).init(state["params"]), jax.devices()[0])
    mb = {k: jnp.asarray(v)[None] for k, v in batch.items()}  # [M=1, B, T]

    def step():
        state["params"], state["opt"], metrics = update(state["params"], state["opt"], mb)
        return {k: float(v) for k, v in jax.device_get(metrics).items()}

    return step, config


def setup_torch(path: Path, batch: dict, dtype: str, param_dtype: str = "float32"):
    import numpy as np
    import torch
    import transformers

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_num_threads(os.cpu_count() or 1)
    model = (
        transformers.AutoModelForCausalLM.from_pretrained(
            str(path), dtype=getattr(torch, param_dtype), attn_implementation="sdpa"
        )
        .to(dev)
        .train()
    )
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
    t = {k: torch.as_tensor(np.ascontiguousarray(v)).to(dev) for k, v in batch.items()}
    mask = t["loss_mask"].float()
    adv = t["advantages"][:, None]
    autocast = torch.autocast(dev, dtype=torch.bfloat16, enabled=dtype == "bfloat16")

    def step():
        with autocast:
            logits = model(
                input_ids=t["tokens"].long(),
                attention_mask=t["attention_mask"].long(),
                position_ids=t["positions"].long(),
            ).logits.float()
        logp_all = torch.log_softmax(logits, dim=-1)
        logp = logp_all.gather(-1, t["labels"].long()[..., None])[..., 0]
        ratio = torch.exp(logp - logp.detach())
        pg = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - CLIP, 1 + CLIP))
        loss = (pg * mask).sum() / mask.sum()
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1)
            entropy = (entropy * mask).sum() / mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if dev == "cuda":
            torch.cuda.synchronize()
        return {"loss": loss.item(), "entropy": entropy.item()}

    return step


def step_flops(config, tokens: int, T: int) -> float:
    return tokens * (
        6 * config.num_params() + 12 * config.num_layers * config.num_heads * config.head_dim * T
    )


def measure(name: str, repeats: int, torch_side: bool = True) -> dict:
    import torch
    import transformers

    _, keys, B, T, dtype = SIZES[name]
    with tempfile.TemporaryDirectory(prefix="marljax-bench-train-") as tmp:
        torch.manual_seed(0)
        transformers.AutoModelForCausalLM.from_config(hf_config(name)).save_pretrained(tmp)
        batch = make_batch(keys["vocab_size"], B, T)
        m_step, config = setup_marljax(Path(tmp), batch, dtype)
        calls = {
            "marljax": m_step,
            "marljax_scan": setup_marljax(Path(tmp), batch, dtype, scan_layers=True)[0],
        }
        if torch_side:
            calls["transformers"] = setup_torch(Path(tmp), batch, dtype)
        # same weights, same batch: the first step's entropy metric must agree
        first = {lib: fn() for lib, fn in calls.items()}
        pairs = (
            [("marljax", "transformers"), ("marljax_scan", "transformers")]
            if torch_side
            else [("marljax", "marljax_scan")]
        )
        diffs = []
        for lib, ref in pairs:
            a, b = first[lib]["entropy"], first[ref]["entropy"]
            diffs.append(abs(a - b) / abs(b))
            if diffs[-1] > (2e-2 if dtype == "bfloat16" else 1e-3):
                raise AssertionError(f"{name}: entropy differs: {lib} {a} vs {ref} {b}")
        check = max(diffs)
        res = interleaved(calls, repeats, warmup=1)
    tokens = B * T
    flops = step_flops(config, tokens, T)
    out = {
        "size": name,
        "params": config.num_params(),
        "batch": B,
        "seq_len": T,
        "dtype": dtype,
        "tokens_per_step": tokens,
        "flops_per_step": flops,
        "entropy_rel_diff": check,
    }
    for lib, r in res.items():
        out[lib] = {
            "seconds": r["seconds"],
            "best_seconds": r["best_seconds"],
            "all_seconds": r["all_seconds"],
            "tokens_per_s": tokens / r["seconds"],
            "flops_per_s": flops / r["seconds"],
        }
    out["unrolled_over_scan"] = res["marljax_scan"]["seconds"] / res["marljax"]["seconds"]
    if torch_side:
        out["speedup"] = res["transformers"]["seconds"] / res["marljax"]["seconds"]
        out["speedup_best"] = res["transformers"]["best_seconds"] / res["marljax"]["best_seconds"]
        out["speedup_scan"] = res["transformers"]["seconds"] / res["marljax_scan"]["seconds"]
    return out


def run(mode: str = "full", peak_flops: dict | None = None, sizes=None) -> dict:
    import jax
    import torch

    gpu = jax.default_backend() != "cpu"
    if sizes is None:
        sizes = {"smoke": ["smoke"], "quick": ["tiny", "50m"], "full": ["tiny", "50m"]}[mode]
    repeats = {"smoke": 1, "quick": 3, "full": 5}[mode]
    torch_ok = (not gpu) or torch.cuda.is_available()  # never compare a GPU against torch on CPU
    if mode == "smoke":  # in this process, as it was started
        rows = [{**measure(s, repeats, torch_side=torch_ok), "host_memory": "as started"} for s in sizes]
    else:
        rows = [
            {
                **child_json(
                    [sys.executable, __file__, "--child", s, "--repeats", str(repeats)]
                    + ([] if torch_ok else ["--no-torch"]),
                    env=env(),
                ),
                "host_memory": name,
            }
            for s in sizes
            for name, env in HOST_MEMORY.items()
        ]
    for r in rows:
        peak = (peak_flops or {}).get(r["dtype"])
        for lib in ("marljax", "marljax_scan", "transformers"):
            if lib in r and peak:
                r[lib]["fraction_of_peak"] = r[lib]["flops_per_s"] / peak
    lines = [
        f"tokens/s of one update step (median of {repeats} interleaved calls); FLOP/s = tokens x "
        "(6 N + 12 L d_attn T) / s, as a fraction of the measured matmul peak of the same dtype.\n",
        "marljax: layers unrolled (`scan_layers: false`); scanned: the same under `lax.scan` (the default).\n",
        "| size | params | dtype | batch x T | host memory | marljax tokens/s | transformers tokens/s | "
        "marljax / transformers (best of each) | marljax GFLOP/s (of peak) | transformers GFLOP/s (of peak) "
        "| scanned tokens/s (/ transformers) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:

        def cell(lib, r=r):
            if lib not in r:
                return "-", "-"
            x = r[lib]
            frac = f" ({100 * x['fraction_of_peak']:.0f}%)" if "fraction_of_peak" in x else ""
            return fmt(x["tokens_per_s"]), f"{x['flops_per_s'] / 1e9:,.1f}{frac}"

        (mt, mf), (tt, tf) = cell("marljax"), cell("transformers")
        sp = f"**{r['speedup']:.2f}x** ({r['speedup_best']:.2f}x)" if "speedup" in r else "-"
        scan = cell("marljax_scan")[0] + (f" ({r['speedup_scan']:.2f}x)" if "speedup_scan" in r else "")
        lines.append(
            f"| {r['size']} | {r['params'] / 1e6:.1f} M | {r['dtype']} | {r['batch']} x {r['seq_len']} "
            f"| {r['host_memory']} | {mt} | {tt} | {sp} | {mf} | {tf} | {scan} |"
        )
    return {"rows": rows, "repeats": repeats, "markdown": "\n".join(lines)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sizes", nargs="+", choices=sorted(SIZES))
    ap.add_argument("--child", choices=sorted(SIZES), help=argparse.SUPPRESS)  # one size, JSON on stdout
    ap.add_argument("--repeats", type=int, default=5, help=argparse.SUPPRESS)
    ap.add_argument("--no-torch", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        emit_json(measure(args.child, args.repeats, torch_side=not args.no_torch))
        return
    out = run("quick" if args.quick else "full", sizes=args.sizes)
    print(out.pop("markdown"))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
