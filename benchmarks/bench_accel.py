"""Sampling on an accelerator: do the KV-cache layouts and attention implementations agree there, and
what continuous batching gains at the 0.5B shape in bfloat16.

    python benchmarks/bench_accel.py [--smoke] [--out FILE]

1. Agreement. The logits of the sampler's decode function (prompts into their rows' cache slots,
   then teacher-forced one-token steps) with the "split" cache (the CPU layout) and the "bskh"
   cache with XLA's attention, in float32 and bfloat16, and in bfloat16 on a GPU with cuDNN's
   (`attention_impl: cudnn`): the relative error against float32 "split".
2. Long tail. `bench_generate.longtail_budgets` requests (end of sequence disabled) at the shape of
   Qwen2.5-0.5B in bfloat16 (random weights): "static" (a slot per request, no refill, all rows in
   lockstep until the longest ends) against "continuous" (the default schedule with S slots), for
   cuDNN's attention where it agreed in 1, else XLA's; useful tokens/s, slot-steps per useful token,
   interleaved calls after a warm-up.

A CPU runs the same code in --smoke (tiny shapes, XLA attention only) so that it stays tested.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

# requests, largest budget, prompt tokens, slots, timed repeats
LONGTAIL = {"smoke": (16, 32, 8, 4, 1), "full": (128, 512, 32, 32, 2)}


def _requests(config, count: int, budgets, prompt: int):
    import numpy as np

    from marljax.sampler import Request

    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, config.vocab_size, size=prompt).astype(np.int32) for _ in range(count)]
    prompts[-1][: prompt // 2] = prompts[0][: prompt // 2]  # a shared prefix
    return [Request(p, int(b), temperature=1.0, top_p=0.9) for p, b in zip(prompts, budgets)]


def agreement(smoke: bool) -> list[dict]:
    """Logits of the sampler's decode function (`extend_step`: prompts of different lengths into
    their rows' cache slots, then one-token steps, teacher-forced on the same tokens) for each cache
    layout, dtype and attention implementation, against float32 with the "split" cache: the
    relative error ||logits - reference|| / ||reference|| over all steps. Sampled tokens are no test
    here: a random model's next-token distribution is nearly flat over the vocabulary, so any
    rounding moves a draw."""
    import functools

    import jax
    import jax.numpy as jnp
    import numpy as np

    from marljax.models import ModelConfig, init_model
    from marljax.models.decode import decode_weights, extend_step, init_decode_cache
    from marljax.models.decoder import get_params

    base = ModelConfig.preset("tiny-qwen3" if smoke else "qwen2.5-0.5b")
    if not smoke:
        base = base.replace(num_layers=2)  # the real widths and heads; depth only adds time
    params = get_params(init_model(base, seed=0))
    B, steps, S = 4, 8, 32
    prompt = np.array([16, 9, 12, 5])  # rows sit at different cache positions
    ids = np.random.default_rng(0).integers(3, base.vocab_size, (B, prompt.max() + steps)).astype(np.int32)
    first = np.where(np.arange(prompt.max())[None] < prompt[:, None], ids[:, : prompt.max()], 0)
    variants = [("float32", "split", None), ("float32", "bskh", None), ("bfloat16", "split", None)]
    variants += [("bfloat16", "bskh", None)]
    if jax.default_backend() == "gpu":
        variants += [("bfloat16", "bskh", "cudnn")]
    logits, out = {}, []
    for dtype, layout, impl in variants:
        config = base.replace(dtype=dtype, param_dtype=dtype, attention_impl=impl)
        name = f"{dtype}, {layout}, {impl or 'xla'}"
        try:
            weights = decode_weights(jax.tree.map(lambda x, d=dtype: x.astype(d), params), config, False)
            step = jax.jit(functools.partial(extend_step, config=config, layout=layout))
            kv = init_decode_cache(config, B, S, layout=layout)
            got, kv = step(weights, jnp.asarray(first), jnp.zeros(B, jnp.int32), jnp.asarray(prompt), kv)
            seen = [np.asarray(got)]
            for t in range(steps):
                pos = prompt + t
                tokens = jnp.asarray(ids[np.arange(B), pos][:, None])
                got, kv = step(weights, tokens, jnp.asarray(pos, jnp.int32), jnp.ones(B, jnp.int32), kv)
                seen.append(np.asarray(got))
            logits[name] = np.stack(seen).astype(np.float64)
        except Exception as e:  # a kernel the backend cannot compile: report it, go on
            out.append({"variant": name, "error": f"{type(e).__name__}: {e}"[:2000]})
    ref = logits["float32, split, xla"]
    for name, x in logits.items():
        if name != "float32, split, xla":
            out.append(
                {"variant": name, "relative_error": float(np.linalg.norm(x - ref) / np.linalg.norm(ref))}
            )
    return out


def longtail(smoke: bool, impls: list[str | None]) -> list[dict]:
    from bench_common import interleaved
    from bench_generate import longtail_budgets

    from marljax.models import ModelConfig, init_model
    from marljax.models.decoder import get_params
    from marljax.sampler import Schedule, get_engine

    count, largest, prompt, slots, repeats = LONGTAIL["smoke" if smoke else "full"]
    shape = "tiny-qwen3" if smoke else "qwen2.5-0.5b"
    base = ModelConfig.preset(shape, dtype="bfloat16", param_dtype="bfloat16")
    params = get_params(init_model(base, seed=0))
    budgets = longtail_budgets(count, largest)
    useful = sum(budgets)
    requests = _requests(base, count, budgets, prompt)
    calls = {}
    for impl in impls:
        engine = get_engine(base.replace(attention_impl=impl))

        def call(engine=engine, schedule=None):
            before = engine.stats.slot_steps
            done = list(engine.run(params, requests, seed=0, eos=[], stop=[], schedule=schedule))
            assert sorted(len(c.tokens) for c in done) == sorted(budgets)
            return {"slot_steps": engine.stats.slot_steps - before, "layout": engine.layout}

        tag = impl or "xla"
        calls[f"static, {tag}"] = lambda c=call: c(
            schedule=Schedule(slots=count, shrink=False, share_prefixes=False)
        )
        calls[f"continuous, {tag}"] = lambda c=call: c(schedule=Schedule(slots=slots))
    timed = interleaved(calls, repeats, warmup=1)
    rows = []
    for name, r in timed.items():
        static = timed[name.replace("continuous", "static")]["best_seconds"]
        rows.append(
            {
                "engine": name,
                "layout": r["last"]["layout"],
                "tokens_per_s": useful / r["best_seconds"],
                "vs_static": static / r["best_seconds"],
                "slot_steps_per_token": r["last"]["slot_steps"] / useful,
                "seconds": r["all_seconds"],
            }
        )
    meta = dict(
        shape=shape, requests=count, largest=largest, longest=max(budgets), prompt=prompt, slots=slots
    )
    return [{"meta": meta, "useful_tokens": useful}] + rows


def run(smoke: bool = False, out_path: Path | None = None) -> dict:
    """Both parts; with `out_path`, the JSON is written after each (a time limit keeps part 1)."""
    import jax

    out = {
        "device": str(jax.devices()[0].device_kind),
        "backend": jax.default_backend(),
        "jax": jax.__version__,
    }

    def save():
        out["markdown"] = markdown(out)
        if out_path:
            out_path.write_text(json.dumps(out, indent=2))

    t = time.perf_counter()
    out["agreement"] = agreement(smoke)
    out["agreement_s"] = time.perf_counter() - t
    save()
    # cuDNN's attention for the long tail where its error is a bfloat16 error (at most twice XLA's)
    err = {r["variant"]: r.get("relative_error") for r in out["agreement"]}
    cudnn, xla = err.get("bfloat16, bskh, cudnn"), err.get("bfloat16, bskh, xla")
    impl = "cudnn" if cudnn is not None and xla is not None and cudnn <= 2 * xla else None
    t = time.perf_counter()
    out["longtail"] = longtail(smoke, [impl])
    out["longtail_s"] = time.perf_counter() - t
    save()
    return out


def markdown(out: dict) -> str:
    lines = [
        f"Device {out['device']} (jax {out['jax']}). Decode logits against float32 with the 'split' cache:",
        "",
        "| dtype, cache layout, attention | relative error |",
        "|---|---|",
    ]
    for r in out["agreement"]:
        what = f"failed: {r['error'][:200]}" if "error" in r else f"{r['relative_error']:.2e}"
        lines.append(f"| {r['variant']} | {what} |")
    if "longtail" not in out:
        return "\n".join(lines)
    head, *rows = out["longtail"]
    m = head["meta"]
    lines += [
        "",
        f"Long tail: {m['requests']} requests at the {m['shape']} shape in bfloat16, prompt {m['prompt']}, "
        f"budgets log-normal clipped to {m['largest']} (longest {m['longest']}, {head['useful_tokens']:,} "
        f"tokens), continuous with {m['slots']} slots; best of the timed calls:",
        "",
        "| engine | cache layout | useful tokens/s | vs static (same attention) | slot-steps per useful token |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['engine']} | {r['layout']} | {r['tokens_per_s']:,.0f} | {r['vs_static']:.2f}x | "
            f"{r['slot_steps_per_token']:.2f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    out = run(args.smoke, args.out)
    print(out["markdown"], flush=True)
    return out


if __name__ == "__main__":
    main()
