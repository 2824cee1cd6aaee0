"""Sampling on an accelerator: do the KV-cache layouts and attention implementations agree there, and
what continuous batching gains at the 0.5B shape in bfloat16.

    python benchmarks/bench_accel.py [--smoke] [--out FILE]

1. Agreement. One random model, the same requests (queueing, slot refill, a shared prefix; T = 1,
   top-p 0.9) through the engine with the "split" cache (the CPU layout), the "bskh" cache with
   XLA's attention and, in bfloat16 on a GPU, "bskh" with cuDNN's (`attention_impl: cudnn`).
   Reported per variant against "split" in the same dtype: the rows whose tokens are all equal, and
   the largest log-prob difference over each row's common prefix (a row can leave the reference
   where rounding moves a sampled token across a boundary of the top-p set; from there it is
   another sequence, not an error).
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
    import jax
    import numpy as np

    from marljax.models import ModelConfig, init_model
    from marljax.models.decoder import get_params
    from marljax.sampler import Schedule, get_engine

    on_gpu = jax.default_backend() == "gpu"
    out = []
    for dtype in ("float32", "bfloat16"):
        base = ModelConfig.preset("tiny-qwen3" if smoke else "qwen2.5-0.5b", dtype=dtype, param_dtype=dtype)
        if not smoke:
            base = base.replace(num_layers=2)  # the real widths and heads; depth only adds time
        params = get_params(init_model(base, seed=0))
        budgets = [3, 40, 17, 1, 64, 25, 64, 9]
        requests = _requests(base, len(budgets), budgets, 16)
        kw = dict(seed=3, eos=[], stop=[], schedule=Schedule(slots=4))
        variants = {"split": (base, "split"), "bskh, xla": (base, "bskh")}
        if on_gpu and dtype == "bfloat16":
            variants["bskh, cudnn"] = (base.replace(attention_impl="cudnn"), "bskh")
        runs = {}
        for name, (config, layout) in variants.items():
            try:
                engine = get_engine(config, cache_layout=layout)
                runs[name] = sorted(engine.run(params, requests, **kw), key=lambda c: c.index)
            except Exception as e:  # a kernel the backend cannot compile: report, go on
                out.append({"dtype": dtype, "variant": name, "error": f"{type(e).__name__}: {e}"[:2000]})
        for name, rows in runs.items():
            if name == "split":
                continue
            equal, worst = 0, 0.0
            for ref, got in zip(runs["split"], rows):
                a, b = np.asarray(ref.tokens), np.asarray(got.tokens)
                n = min(len(a), len(b))
                same = int(np.argmax(a[:n] != b[:n])) if np.any(a[:n] != b[:n]) else n
                equal += bool(same == n == len(a) == len(b))
                if same:
                    diff = np.abs(np.asarray(ref.logprobs[:same]) - np.asarray(got.logprobs[:same]))
                    worst = max(worst, float(diff.max()))
            out.append(
                {
                    "dtype": dtype,
                    "variant": name,
                    "rows": len(rows),
                    "rows_equal": equal,
                    "max_logprob_diff": worst,
                }
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
    cudnn = [r for r in out["agreement"] if r["variant"] == "bskh, cudnn"]
    impl = "cudnn" if cudnn and "error" not in cudnn[0] and cudnn[0]["max_logprob_diff"] < 0.5 else None
    t = time.perf_counter()
    out["longtail"] = longtail(smoke, [impl])
    out["longtail_s"] = time.perf_counter() - t
    save()
    return out


def markdown(out: dict) -> str:
    lines = [
        f'Device {out["device"]} (jax {out["jax"]}). Agreement with the "split" cache, same dtype:',
        "",
        "| dtype | variant | rows with equal tokens | max log-prob difference on the common prefix |",
        "|---|---|---|---|",
    ]
    for r in out["agreement"]:
        if "error" in r:
            lines.append(f"| {r['dtype']} | {r['variant']} | failed: {r['error'][:200]} | - |")
        else:
            lines.append(
                f"| {r['dtype']} | {r['variant']} | {r['rows_equal']} / {r['rows']} | {r['max_logprob_diff']:.2e} |"
            )
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
