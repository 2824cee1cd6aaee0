"""Train-step MFU of the trainer's RL update at the Qwen2.5-0.5B and 1.5B shapes (a GPU measurement).

    python benchmarks/bench_mfu.py --out /tmp/mfu.json --budget 280     # on the GPU, ~5 min
    python benchmarks/bench_mfu.py --smoke --out /tmp/mfu.json          # tiny shapes on a CPU, < 1 min

Each case is one shape x attention (XLA's from a dense mask, or "cudnn" fused flash attention) x
remat policy, at 8 rows x 1024 tokens, bfloat16 compute, float32 master weights, the trainer's
optimiser (`OptimizerConfig()`: AdamW, global-norm clipping) and loss (`LossConfig()`: PPO,
token-mean). The update is the trainer's own (`marljax.train.learner.step_functions`, one device,
no mesh), compiled ahead of time, then called
`--steps` times after `--warmup` calls, each timed to `block_until_ready`.

Model FLOPs per step (the useful work, what MFU counts; recomputation under remat is not):

    6 N tokens + 6 L H d_head T tokens

N the parameters (tied embeddings once: the output projection uses them), L layers, H query heads,
d_head the head size, T the sequence length: the 12 L H d_head T per token of PaLM's formula halved,
as causal attention needs only the lower triangle. `xla_flops` is `compiled.cost_analysis()`'s
count: everything XLA runs, so it includes the full (masked) T x T attention of the XLA path, any
recomputation, the optimiser's and the loss's elementwise work, and not the inside of a cuDNN
custom call. XLA counts a loop's body once, whatever its trip count, so for the layers under
`lax.scan` (`scan_layers`, the trainer's default) `xla_flops` is that of the same update with its
layers unrolled, lowered but not compiled (a second or two; the compiled scanned program's count,
`xla_flops_compiled`, is kept for reference). `xla_over_model` = xla_flops / model FLOPs: about
1.2-1.3 at the smoke shape without remat (full T x T attention, the loss's elementwise work over
a 512-word vocabulary next to a 64-wide model), ~1.45 with remat "full" (the layers' forward again).

MFU = model FLOPs / median step seconds / the bfloat16 matmul peak measured in the same process
(`bench_peak.matmul_flops`, best size). Memory per case: the compiled program's own analysis
(arguments, outputs, temporaries) and, on a GPU, the device's `peak_bytes_in_use` so far (it only
grows within a process, so it is an upper bound for every case after the first).

The JSON is rewritten after every case, so a run killed at its time limit keeps what it measured;
a case that fails (out of memory, cuDNN refusing a shape) is recorded with its error and skipped.
Cases run most important first (cuDNN attention, the cheapest remat policies) and a case is skipped
when less than about its expected time is left of `--budget`.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_peak  # noqa: E402
import bench_train  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from marljax.models.config import ModelConfig  # noqa: E402
from marljax.models.decoder import get_params, init_model  # noqa: E402
from marljax.testing.real_shapes import SHAPES as REAL_SHAPES  # noqa: E402
from marljax.train.config import LossConfig, OptimizerConfig  # noqa: E402
from marljax.train.learner import step_functions  # noqa: E402

# HF config values of Qwen2.5-1.5B(-Instruct); marljax.testing.real_shapes has only the 0.5B shape
QWEN25_1_5B = dict(
    vocab_size=151936,
    hidden_size=1536,
    intermediate_size=8960,
    num_hidden_layers=28,
    num_attention_heads=12,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)
SHAPES = {
    "qwen2.5-0.5b": REAL_SHAPES["qwen2.5-0.5b"][1],
    "qwen2.5-1.5b": QWEN25_1_5B,
    # the smoke shape: the 0.5B layout (Qwen2: q/k/v biases, tied embeddings) made tiny
    "smoke": dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
}
# (shape, attention, remat), most important first: the targets are for cuDNN flash attention
# with the best remat policy, and "none" / "minimal" recompute least (so are fastest when they fit);
# XLA attention is the baseline that shows what cuDNN buys
CASES = [
    ("qwen2.5-1.5b", "cudnn", "none"),
    ("qwen2.5-0.5b", "cudnn", "none"),
    ("qwen2.5-1.5b", "cudnn", "minimal"),
    ("qwen2.5-0.5b", "cudnn", "minimal"),
    ("qwen2.5-1.5b", None, "none"),
    ("qwen2.5-0.5b", None, "none"),
    ("qwen2.5-1.5b", "cudnn", "dots"),
    ("qwen2.5-0.5b", "cudnn", "dots"),
    ("qwen2.5-1.5b", "cudnn", "full"),
    ("qwen2.5-0.5b", "cudnn", "full"),
]
# cuDNN attention does not run on a CPU, so the smoke run covers the XLA path only,
# with the least and the most recomputation (each compile is ~10 s on a 2-core CPU)
SMOKE_CASES = [("smoke", None, "none"), ("smoke", None, "full")]
ROWS, SEQ, SMOKE_ROWS, SMOKE_SEQ = 8, 1024, 2, 64
FIRST_CASE_S = {"qwen2.5-0.5b": 60.0, "qwen2.5-1.5b": 90.0, "smoke": 5.0}  # before one is measured


def model_config(shape: str, attention: str | None, remat: str, scan_layers: bool = True) -> ModelConfig:
    return ModelConfig.from_hf(
        {**SHAPES[shape], "model_type": "qwen2"},
        dtype="bfloat16",
        param_dtype="float32",
        remat=remat,
        attention_impl=attention,
        scan_layers=scan_layers,
    )


def model_flops(config: ModelConfig, rows: int, seq: int) -> dict:
    tokens = rows * seq
    attn = 6 * config.num_layers * config.num_heads * config.head_dim * seq * tokens  # causal: half
    dense = 6 * config.num_params() * tokens
    return {"model_flops": dense + attn, "model_flops_full_attention": dense + 2 * attn}


def xla_flops(program) -> float | None:
    """XLA's FLOP count of a lowered or compiled program."""
    try:
        cost = program.cost_analysis()
    except Exception:  # not every backend implements it
        return None
    if isinstance(cost, list | tuple):  # older jax: one dict per program
        cost = cost[0] if cost else None
    return float(cost["flops"]) if cost and "flops" in cost else None


def memory(compiled) -> dict:
    out = {}
    try:
        m = compiled.memory_analysis()
        for k in ("argument", "output", "alias", "temp"):
            out[f"{k}_bytes"] = int(getattr(m, f"{k}_size_in_bytes"))
    except Exception:
        pass
    stats = jax.devices()[0].memory_stats() or {}  # None on a CPU
    for k in ("peak_bytes_in_use", "bytes_in_use", "bytes_limit"):
        if k in stats:
            out[k] = int(stats[k])
    return out


def measure_case(params, shape, attention, remat, rows, seq, warmup, steps, peak, scan_layers=True) -> dict:
    """One case; `params` are the shape's float32 master weights (copied: the update donates them)."""
    config = model_config(shape, attention, remat, scan_layers)
    # the trainer's own optimiser and update program (default optimiser and loss settings)
    opt_cfg, loss = OptimizerConfig(), LossConfig()
    optimizer, update, _, _ = step_functions(config, opt_cfg, loss, False)
    device = jax.devices()[0]
    p = jax.tree.map(jnp.copy, params)
    o = jax.device_put(optimizer.init(p), device)
    mb = {
        k: jax.device_put(jnp.asarray(v)[None], device)
        for k, v in bench_train.make_batch(config.vocab_size, rows, seq).items()
    }  # [M=1, rows, seq], as collate lays out one micro-batch
    t = time.perf_counter()
    compiled = update.lower(p, o, mb).compile()
    compile_s = time.perf_counter() - t
    hlo = None
    if scan_layers:  # the same program with its layers unrolled, lowered only: see the module doc
        unrolled = model_config(shape, attention, remat, scan_layers=False)
        hlo = step_functions(unrolled, opt_cfg, loss, False)[1].lower(p, o, mb)
    hf = xla_flops(hlo if hlo is not None else compiled)
    times = []
    for i in range(warmup + steps):
        t = time.perf_counter()
        p, o, metrics = compiled(p, o, mb)
        jax.block_until_ready((p, o, metrics))
        if i >= warmup:
            times.append(time.perf_counter() - t)
    loss_value = float(metrics["loss"])
    step_s = statistics.median(times)
    flops = model_flops(config, rows, seq)
    xf = xla_flops(compiled)
    out = {
        "shape": shape,
        "attention": attention or "xla",
        "remat": remat,
        "scan_layers": scan_layers,
        "rows": rows,
        "seq": seq,
        "tokens": rows * seq,
        "params": config.num_params(),
        "compile_s": compile_s,
        "step_s": step_s,
        "step_s_all": times,
        "tokens_per_s": rows * seq / step_s,
        **flops,
        "xla_flops_compiled": xf,
        "xla_flops": hf,
        "xla_over_model": hf / flops["model_flops"] if hf else None,
        "achieved_flops_per_s": flops["model_flops"] / step_s,
        "mfu": flops["model_flops"] / step_s / peak,
        "loss": loss_value,
        "memory": memory(compiled),
    }
    del p, o, compiled
    return out


def table(res: dict) -> str:
    lines = [
        f"Train step (rl_loss + AdamW, bf16 compute, f32 master weights) on {res['device']}; "
        f"MFU against the measured bf16 matmul peak {res['peak_bf16_flops'] / 1e9:,.0f} GFLOP/s.\n",
        "| shape | attention | remat | rows x T | compile s | step s | tokens/s | model GFLOP | "
        "XLA / model FLOPs | MFU | temp GiB | peak GiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in res["cases"]:
        head = f"| {c['shape']} | {c['attention']} | {c['remat']} | {c['rows']} x {c['seq']} |"
        if "error" in c:
            lines.append(f"{head} {c['error'][:80]} |" + " |" * 7)
            continue
        m = c["memory"]
        gib = [f"{m[k] / 2**30:.2f}" if k in m else "-" for k in ("temp_bytes", "peak_bytes_in_use")]
        ratio = f"{c['xla_over_model']:.2f}" if c["xla_over_model"] else "-"
        lines.append(
            f"{head} {c['compile_s']:.1f} | {c['step_s']:.4f} | {c['tokens_per_s']:,.0f} | "
            f"{c['model_flops'] / 1e9:,.1f} | {ratio} | **{100 * c['mfu']:.1f}%** | {gib[0]} | {gib[1]} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/marljax_bench_mfu.json"))
    ap.add_argument("--budget", type=float, default=280.0, help="seconds; later cases are skipped")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, XLA attention (a CPU dry run)")
    ap.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), help="only these shapes")
    ap.add_argument("--attention", nargs="+", choices=["xla", "cudnn"], help="only these")
    ap.add_argument("--remat", nargs="+", choices=["none", "minimal", "dots", "full"], help="only these")
    ap.add_argument("--rows", type=int)
    ap.add_argument("--seq", type=int)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--unrolled", action="store_true", help="scan_layers: false (longer compiles)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    if args.smoke and (args.attention or args.remat):  # any smoke case asked for (cuDNN: its error path)
        cases = [
            ("smoke", None if a == "xla" else a, r)
            for a in args.attention or ["xla"]
            for r in args.remat or ["none", "full"]
        ]
    else:
        cases = SMOKE_CASES if args.smoke else CASES
    cases = [
        c
        for c in cases
        if (not args.shapes or c[0] in args.shapes)
        and (not args.attention or (c[1] or "xla") in args.attention)
        and (not args.remat or c[2] in args.remat)
    ]
    rows = args.rows or (SMOKE_ROWS if args.smoke else ROWS)
    seq = args.seq or (SMOKE_SEQ if args.smoke else SEQ)
    gpu = jax.default_backend() != "cpu"
    sizes = [256, 512] if args.smoke else ([4096, 8192, 16384] if gpu else [1024, 2048])
    by_size = {n: bench_peak.matmul_flops(n, jnp.bfloat16, repeats=3 if args.smoke else 5) for n in sizes}
    res = {
        "device": str(jax.devices()[0].device_kind),
        "backend": jax.default_backend(),
        "jax": jax.__version__,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        # with a persistent cache, a second run's compile_s are cache reads
        "compilation_cache": os.environ.get("JAX_COMPILATION_CACHE_DIR"),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "peak_bf16_flops": max(by_size.values()),
        "peak_bf16_by_size": by_size,
        "flops_formula": "6 N tokens + 6 L H d_head T tokens (causal attention: half of PaLM's 12 L H d_head T)",
        "cases": [],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save():
        res["elapsed_s"] = time.perf_counter() - t0
        res["markdown"] = table(res)  # a killed run's JSON has its table too (device_session's summary)
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(res, indent=1, default=str))
        tmp.replace(args.out)  # whole file or the previous one, never half of one

    save()
    master: dict[str, dict] = {}  # shape -> float32 weights, made once (a case copies them)
    last_s: dict[str, float] = {}  # shape -> how long its last case took
    for shape, attention, remat in cases:
        left = args.budget - (time.perf_counter() - t0)
        need = 1.2 * last_s.get(shape, FIRST_CASE_S[shape])
        case = {"shape": shape, "attention": attention or "xla", "remat": remat, "rows": rows, "seq": seq}
        if left < need:
            res["cases"].append({**case, "error": f"skipped: {left:.0f} s left, about {need:.0f} s needed"})
            save()
            continue
        t = time.perf_counter()
        try:
            if shape not in master:  # kept for the shape's later cases (both shapes: 8 GiB)
                master[shape] = get_params(init_model(model_config(shape, None, "none")))
            r = measure_case(
                master[shape],
                shape,
                attention,
                remat,
                rows,
                seq,
                args.warmup,
                args.steps,
                res["peak_bf16_flops"],
                scan_layers=not args.unrolled,
            )
        except Exception as e:  # out of memory, cuDNN refusing a shape: record it and go on
            r = {**case, "error": f"{type(e).__name__}: {str(e)[:600]}"}
        gc.collect()
        r["case_s"] = time.perf_counter() - t
        if "error" not in r:  # a quick failure says nothing about how long the next case takes
            last_s[shape] = r["case_s"]
        res["cases"].append(r)
        save()
        print(
            f"{shape} {attention or 'xla'} {remat}: "
            + (r.get("error") or f"{r['step_s']:.4f} s/step, MFU {100 * r['mfu']:.1f}%"),
            flush=True,
        )
    save()
    print(res["markdown"])


if __name__ == "__main__":
    main()
