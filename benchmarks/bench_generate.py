"""Generation throughput: marljax sampler vs transformers `generate` vs tunix's vanilla sampler.

    python benchmarks/bench_generate.py [--quick] [--batch 8 32] [--prompt 32] [--new 128] [--repeats 7]
        [--tunix-python /tmp/tunixenv/bin/python] [--json PATH]
    (JSON default: $TMPDIR/marljax_bench_generate.json)

Same random tiny Qwen3 checkpoint for all three (written once with transformers:
4 layers, hidden 256, MLP 768, 4 heads / 2 kv heads of 64, vocab 2048, tied
embeddings: 3.67 M parameters), float32 on CPU. Each prompt is `--prompt`
random token ids; every row generates exactly `--new` tokens (EOS disabled
everywhere), greedy and top-p 0.9 (temperature 1, no top-k; transformers'
default top_k=50 is switched off so all three sample from the same
distribution). Throughput = generated tokens / wall time of one whole call
(prefill included), median of `--repeats` calls after a warm-up call that
compiles. torch gets as many threads as XLA's CPU client has cores.

Each ratio comes from one process in which the two libraries' calls alternate
(A B A B ...), so both see the same machine load: marljax vs transformers in
this environment, then marljax vs tunix in tunix's own virtual environment
(google-tunix from PyPI, `--tunix-python`; see benchmarks/RESULTS.md for how it
was installed). Its prompts go through a tokenizer shim that maps "5 6 7" to
ids [5, 6, 7], so all three see identical token ids. Greedy outputs of the
three are compared token by token as a sanity check.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

CKPT = dict(
    vocab_size=2048,
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=4096,
)
SETTINGS = {"greedy": dict(temperature=0.0, top_p=1.0), "top_p=0.9": dict(temperature=1.0, top_p=0.9)}


# smoke mode only (compiles faster): 1 layer, hidden 64, same vocabulary
SMOKE_CKPT = {**CKPT, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "head_dim": 16}


def make_checkpoint(path: Path, spec: dict = CKPT) -> Path:
    from marljax.testing import make_tiny_checkpoint

    if not (path / "config.json").exists():
        make_tiny_checkpoint(path, "qwen3", seed=0, tokenizer=False, **spec)
    return path


def prompts(batch: int, length: int, vocab: int = CKPT["vocab_size"]) -> list[list[int]]:
    import numpy as np

    rng = np.random.RandomState(batch * 1000 + length)
    return rng.randint(3, vocab, size=(batch, length)).tolist()


# ----------------------------------------------------------------------------- runners
# Each runner returns {mode: (call, tokens_of)}: `call()` generates once (B x new tokens),
# `tokens_of(out)` gives the [B, new] token ids. Calls of different libraries are
# interleaved in one process (A B A B ...) so that they see the same machine load.
def setup_marljax(path, batch, plen, new):
    from marljax.models import from_pretrained
    from marljax.sampler import SamplingParams, generate

    model, _ = from_pretrained(path)
    ids = prompts(batch, plen)

    def make(kw):
        def call():
            out = generate(model, ids, SamplingParams(new, **kw), eos_ids=(), seed=0)
            assert (out.lengths == new).all()
            return out

        return call, lambda out: out.tokens.tolist()

    return {mode: make(kw) for mode, kw in SETTINGS.items()}


def setup_transformers(path, batch, plen, new, threads):
    import torch
    import transformers

    torch.set_num_threads(threads)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).to(dev).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    ids = torch.tensor(prompts(batch, plen), device=dev)

    def make(kw):
        gkw = (
            dict(do_sample=False)
            if kw["temperature"] == 0
            else dict(do_sample=True, temperature=kw["temperature"], top_p=kw["top_p"], top_k=0)
        )

        def call():
            with torch.no_grad():
                return model.generate(
                    ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new, **gkw
                ).cpu()  # .cpu() waits for the GPU

        return call, lambda out: out[:, plen:].tolist()

    return {mode: make(kw) for mode, kw in SETTINGS.items()}


class _IdTokenizer:
    """tunix tokenizer shim: "5 6 7" <-> [5, 6, 7]; no BOS, pad 0, EOS -1 (never produced)."""

    def encode(self, text, **_):
        return [int(t) for t in text.split()]

    def decode(self, ids, **_):
        return " ".join(str(int(i)) for i in ids)

    def bos_id(self):
        return None

    def eos_id(self):
        return -1

    def pad_id(self):
        return 0


def setup_tunix(path, batch, plen, new, ids=None):
    import jax.numpy as jnp
    from tunix.generate import sampler as tsampler
    from tunix.models.qwen3 import model as tmodel
    from tunix.models.qwen3 import params as tparams

    cfg = tmodel.ModelConfig(
        num_layers=CKPT["num_hidden_layers"],
        vocab_size=CKPT["vocab_size"],
        embed_dim=CKPT["hidden_size"],
        hidden_dim=CKPT["intermediate_size"],
        num_heads=CKPT["num_attention_heads"],
        head_dim=CKPT["head_dim"],
        num_kv_heads=CKPT["num_key_value_heads"],
        rope_theta=1_000_000,
        norm_eps=1e-6,
        use_tied_embedding=True,
        dtype=jnp.float32,
        param_dtype=jnp.float32,
    )
    model = tparams.create_model_from_safe_tensors(str(path), cfg, dtype=jnp.float32)
    s = tsampler.Sampler(
        model,
        _IdTokenizer(),
        tsampler.CacheConfig(
            cache_size=plen + new,
            num_layers=cfg.num_layers,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
        ),
    )
    texts = [" ".join(map(str, p)) for p in (ids or prompts(batch, plen))]

    def make(kw):
        skw = (
            dict(temperature=0.0)
            if kw["temperature"] == 0
            else dict(temperature=kw["temperature"], top_p=kw["top_p"], top_k=None)
        )

        def call():
            return s(
                texts,
                max_generation_steps=new,
                max_prompt_length=plen,
                eos_tokens=[-1],
                pad_output=True,
                seed=0,
                **skw,
            )

        return call, lambda out: [list(map(int, x.split()))[:new] for x in out.text]

    return {mode: make(kw) for mode, kw in SETTINGS.items()}


def measure(setups: dict, batch: int, new: int, repeats: int) -> dict:
    """Warm up every (library, mode), then `repeats` interleaved rounds; median (and best) seconds."""
    from bench_common import interleaved

    res = {lib: {} for lib in setups}
    for mode in SETTINGS:
        timed = interleaved({lib: setups[lib][mode][0] for lib in setups}, repeats, warmup=1)
        for lib, r in timed.items():
            res[lib][mode] = {
                "seconds": r["seconds"],
                "tokens_per_s": batch * new / r["seconds"],
                "best_tokens_per_s": batch * new / r["best_seconds"],
                "all_seconds": r["all_seconds"],
                "tokens": setups[lib][mode][1](r["last"]),
            }
    return res


# ----------------------------------------------------------------------------- main
def _xla_threads() -> int:
    return os.cpu_count() or 1  # XLA's CPU client uses one thread per core


MODES = {  # batches, prompt, new tokens, repeats, with tunix
    "smoke": ([2], 8, 8, 1, False),
    "quick": ([8, 32], 32, 128, 3, True),
    "full": ([8, 32], 32, 128, 7, True),
}
DEFAULT_CKPT = os.path.join(tempfile.gettempdir(), "marljax_bench_qwen3_3.7m")
TUNIX_PYTHON = "/tmp/tunixenv/bin/python"


def measure_pair(which: str, path: Path, batches, prompt: int, new: int, repeats: int) -> dict:
    """marljax interleaved with `which` ("transformers" or "tunix") in this process."""
    import importlib.metadata

    out = {}
    for b in batches:
        setups = {"marljax": setup_marljax(path, b, prompt, new)}
        if which == "tunix":
            setups["tunix"] = setup_tunix(path, b, prompt, new)
        else:
            setups["transformers"] = setup_transformers(path, b, prompt, new, _xla_threads())
        out[b] = measure(setups, b, new, repeats)
    out["version"] = importlib.metadata.version("google-tunix" if which == "tunix" else "transformers")
    return out


def run_child(
    which: str,
    python: str,
    path: Path,
    batches,
    prompt: int,
    new: int,
    repeats: int,
    in_process: bool = False,
):
    from bench_common import child_json

    if in_process:  # same numbers, without a fresh interpreter's start-up (smoke mode)
        d = json.loads(json.dumps(measure_pair(which, path, batches, prompt, new, repeats)))
    else:
        d = child_json(
            [
                python,
                __file__,
                "--only",
                which,
                "--prompt",
                str(prompt),
                "--new",
                str(new),
                "--repeats",
                str(repeats),
                "--checkpoint",
                str(path),
                "--batch",
                *map(str, batches),
            ]
        )
    version = d.pop("version")
    return {int(k): v for k, v in d.items()}, version


def run(
    mode: str = "full",
    tunix_python: str = TUNIX_PYTHON,
    checkpoint: str = DEFAULT_CKPT,
    batches=None,
    prompt=None,
    new=None,
    repeats=None,
) -> dict:
    """marljax interleaved with transformers (this environment), then marljax interleaved with
    tunix (tunix's environment); each ratio comes from calls interleaved in one process."""
    import numpy as np

    d_batches, d_prompt, d_new, d_repeats, with_tunix = MODES[mode]
    batches, prompt = batches or d_batches, prompt or d_prompt
    new, repeats = new or d_new, repeats or d_repeats
    if mode == "smoke" and checkpoint == DEFAULT_CKPT:
        path = make_checkpoint(Path(tempfile.gettempdir()) / "marljax_bench_qwen3_smoke", SMOKE_CKPT)
    else:
        path = make_checkpoint(Path(checkpoint))
    main_res, hf_version = run_child(
        "transformers", sys.executable, path, batches, prompt, new, repeats, in_process=mode == "smoke"
    )
    tx_res, tx_version, tunix_note = None, None, None
    if with_tunix and tunix_python and Path(tunix_python).exists():
        tx_res, tx_version = run_child("tunix", tunix_python, path, batches, prompt, new, repeats)
    else:
        tunix_note = (
            "tunix skipped"
            + ("" if with_tunix else f" in {mode} mode")
            + (f": {tunix_python!r} not found" if with_tunix else "")
        )
    rows = []
    model = "smoke-size Qwen3 (1 layer" if mode == "smoke" else "tiny Qwen3 (3.67 M params"
    lines = [
        f"Generation, {model}, float32, {_xla_threads()} threads), prompt {prompt}, "
        f"{new} new tokens; tokens/s, median of {repeats} interleaved calls"
        + (f" ({tunix_note})" if tunix_note else "")
        + "\n",
        "| batch | mode | marljax | transformers | marljax (tunix run) | tunix | vs transformers (best of each) "
        "| vs tunix (best of each) | greedy tokens equal (hf / tunix) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for b in batches:
        for mode_name in SETTINGS:
            m, h = main_res[b]["marljax"][mode_name], main_res[b]["transformers"][mode_name]
            m2 = tx_res[b]["marljax"][mode_name] if tx_res else None
            tx = tx_res[b]["tunix"][mode_name] if tx_res else None
            same = ""
            if mode_name == "greedy":
                mt = np.array(m["tokens"])
                same = " / ".join(
                    f"{(np.array(o['tokens']) == mt).mean():.3f}" if o else "-" for o in (h, tx)
                )
            row = {
                "batch": b,
                "mode": mode_name,
                "marljax": m["tokens_per_s"],
                "transformers": h["tokens_per_s"],
                "marljax_tunix_run": m2["tokens_per_s"] if m2 else None,
                "tunix": tx["tokens_per_s"] if tx else None,
                "vs_transformers": m["tokens_per_s"] / h["tokens_per_s"],
                "vs_tunix": m2["tokens_per_s"] / tx["tokens_per_s"] if tx else None,
                "vs_transformers_best": m["best_tokens_per_s"] / h["best_tokens_per_s"],
                "vs_tunix_best": m2["best_tokens_per_s"] / tx["best_tokens_per_s"] if tx else None,
                "greedy_tokens_equal": same or None,
                "seconds": {
                    "marljax": m["all_seconds"],
                    "transformers": h["all_seconds"],
                    "marljax_tunix_run": m2["all_seconds"] if m2 else None,
                    "tunix": tx["all_seconds"] if tx else None,
                },
            }
            rows.append(row)

            def f(v):
                return "-" if v is None else f"{v:,.0f}"

            def r(v, b):
                return "-" if v is None else f"**{v:.2f}x** ({b:.2f}x)"

            lines.append(
                f"| {b} | {mode_name} | {f(row['marljax'])} | {f(row['transformers'])} "
                f"| {f(row['marljax_tunix_run'])} | {f(row['tunix'])} "
                f"| {r(row['vs_transformers'], row['vs_transformers_best'])} "
                f"| {r(row['vs_tunix'], row['vs_tunix_best'])} | {same} |"
            )
    meta = {
        "transformers": hf_version,
        "tunix": tx_version,
        "prompt": prompt,
        "new_tokens": new,
        "repeats": repeats,
        "tunix_note": tunix_note,
    }
    return {"meta": meta, "rows": rows, "markdown": "\n".join(lines)}


# ----------------------------------------------------------------------------- long-tailed
def next_pow2(n: int, minimum: int) -> int:
    """The engine's default bucket of `n` (a power of two >= `minimum`)."""
    return 1 << max(0, (max(n, minimum) - 1).bit_length())


LONGTAIL_MODES = {  # requests, largest budget, prompt length, slots, repeats, transformers batch
    "smoke": (16, 32, 8, 4, 1, 8),
    "quick": (64, 256, 32, 16, 1, 16),
    "full": (256, 1024, 32, 64, 1, 64),
}


def longtail_budgets(requests: int, largest: int, seed: int = 0) -> list[int]:
    """Token budgets drawn log-normally (median `largest / 8`, sigma 1), clipped to [1, largest]:
    most answers short, a tail to the limit."""
    import numpy as np

    rng = np.random.RandomState(seed)
    return (
        np.clip(np.round(rng.lognormal(np.log(largest / 8), 1.0, requests)), 1, largest).astype(int).tolist()
    )


def longtail_tunix(mode: str, checkpoint: str) -> dict:
    """In tunix's environment: tunix's sampler on the long-tailed requests in batches of the
    transformers batch size, each to its longest budget, interleaved with marljax's continuous
    engine on the same requests; best seconds of each."""
    import importlib.metadata

    from bench_common import interleaved

    from marljax.models import from_pretrained
    from marljax.sampler import SamplingParams, Schedule, generate

    N, largest, plen, slots, repeats, batch = LONGTAIL_MODES[mode]
    path = Path(checkpoint)
    budgets = longtail_budgets(N, largest)
    ids = prompts(N, plen)
    model, _ = from_pretrained(path)
    samplers = {}  # tunix: one sampler per (batch, cache size)

    def tunix_call():
        for i in range(0, N, batch):
            part, m = ids[i : i + batch], max(budgets[i : i + batch])
            if (len(part), m) not in samplers:
                samplers[len(part), m] = setup_tunix(path, len(part), plen, m, ids=part)
            samplers[len(part), m]["top_p=0.9"][0]()

    def marljax_call():
        sampling = [SamplingParams(b, temperature=1.0, top_p=0.9) for b in budgets]
        generate(model, ids, sampling, eos_ids=(), seed=0, schedule=Schedule(slots=slots))

    timed = interleaved({"tunix": tunix_call, "marljax": marljax_call}, repeats, warmup=1)
    return {
        "tunix_seconds": timed["tunix"]["best_seconds"],
        "marljax_seconds": timed["marljax"]["best_seconds"],
        "version": importlib.metadata.version("google-tunix"),
    }


def run_longtail(
    mode: str = "full",
    checkpoint: str = DEFAULT_CKPT,
    with_transformers: bool = True,
    tunix_python: str = TUNIX_PYTHON,
    paged: tuple[int, ...] = (),
    paged_pool: float | None = None,
    static: bool = True,
    repeats: int | None = None,
) -> dict:
    """Static vs continuous batching on one long-tailed request set, interleaved in one process.

    Every request ends at its own budget (EOS disabled), which the scheduler does not look
    ahead at: for it a budget is an end it discovers, as an EOS. "static" is the engine with
    a slot for every request and no refill or shrinking: all rows decode in lockstep until
    the longest ends (how the sampler batched before); "static, slot-sized calls" splits the
    requests into calls of the continuous engine's slot count; "continuous" is the default
    schedule with that slot count. transformers `generate` runs the requests in batches of its
    size, each to the longest budget of its batch (its static batching); tunix is not measured
    here. Sampling at temperature 1, top-p 0.9.

    paged: page sizes of extra "continuous, paged" rows (the continuous schedule with the paged
    KV cache, its pool as large as the dense cache); paged_pool: also a row with a pool of this
    fraction of the dense cache's pages (first page size), where requests wait for pages.
    "peak KV in use" is the dense cache (all of it is held) or the most pages in use at once.
    static: include the two static rows. repeats: timed rounds (default the mode's).
    """
    import numpy as np
    from bench_common import interleaved

    from marljax.models import from_pretrained
    from marljax.sampler import SamplingParams, Schedule, generate, get_engine

    N, largest, plen, slots, mode_repeats, hf_batch = LONGTAIL_MODES[mode]
    repeats = repeats or mode_repeats
    spec = SMOKE_CKPT if mode == "smoke" else CKPT
    path = make_checkpoint(
        Path(tempfile.gettempdir()) / "marljax_bench_qwen3_smoke" if mode == "smoke" else Path(checkpoint),
        spec,
    )
    model, config = from_pretrained(path)
    ids = prompts(N, plen)
    budgets = longtail_budgets(N, largest)
    useful = sum(budgets)
    sampling = [SamplingParams(b, temperature=1.0, top_p=0.9) for b in budgets]

    def marljax_call(schedule, calls=1, **layout):
        engine = get_engine(config, **layout)

        def call():
            before = (engine.stats.slot_steps, engine.stats.useful_tokens)
            peak = in_use = 0
            per = -(-N // calls)
            outs = []
            for i in range(0, N, per):
                outs.append(
                    generate(
                        model,
                        ids[i : i + per],
                        sampling[i : i + per],
                        eos_ids=(),
                        seed=0,
                        schedule=schedule,
                        **layout,
                    )
                )
                peak = max(peak, engine.stats.cache_bytes)
                in_use = max(
                    in_use,
                    engine.stats.peak_pages * engine.page_bytes()
                    if engine.paged
                    else engine.stats.cache_bytes,
                )
            lengths = np.concatenate([o.lengths for o in outs])
            assert lengths.tolist() == budgets
            steps = engine.stats.slot_steps - before[0]
            return {
                "slot_steps": steps,
                "useful": engine.stats.useful_tokens - before[1],
                "cache_bytes": peak,
                "in_use_bytes": in_use,
            }

        return call

    calls = {}
    if static:
        calls["static"] = marljax_call(Schedule(slots=N, shrink=False, share_prefixes=False))
        calls["static, slot-sized calls"] = marljax_call(
            Schedule(slots=slots, shrink=False, share_prefixes=False), calls=-(-N // slots)
        )
    calls["continuous"] = marljax_call(Schedule(slots=slots))
    capacity = next_pow2(plen, 16) + next_pow2(largest, 16)
    for ps in paged:
        calls[f"continuous, paged (pages of {ps})"] = marljax_call(
            Schedule(slots=slots), cache_layout="paged", page_size=ps
        )
    if paged and paged_pool:
        ps = paged[0]
        pages = int(paged_pool * slots * -(-capacity // ps))
        calls[f"continuous, paged (pages of {ps}, pool {paged_pool:g}x: {pages} pages)"] = marljax_call(
            Schedule(slots=slots), cache_layout="paged", page_size=ps, num_pages=pages
        )
    hf_version = None
    if with_transformers:
        import importlib.metadata

        import torch
        import transformers

        hf_version = importlib.metadata.version("transformers")
        torch.set_num_threads(_xla_threads())
        hf = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
        hf.generation_config.eos_token_id = None
        hf.generation_config.pad_token_id = 0

        def hf_call():
            rows = 0
            for i in range(0, N, hf_batch):
                x = torch.tensor(ids[i : i + hf_batch])
                m = max(budgets[i : i + hf_batch])
                with torch.no_grad():
                    hf.generate(
                        x,
                        attention_mask=torch.ones_like(x),
                        max_new_tokens=m,
                        min_new_tokens=m,
                        do_sample=True,
                        temperature=1.0,
                        top_p=0.9,
                        top_k=0,
                    )
                rows += len(x) * m
            return {"slot_steps": rows, "useful": useful, "cache_bytes": None}

        calls["transformers generate"] = hf_call
    timed = interleaved(calls, repeats, warmup=1)
    rows = []
    ref_name = "static" if static else "continuous"
    base = useful / timed[ref_name]["best_seconds"]
    cpu_base = useful / timed[ref_name]["best_cpu_seconds"]
    lines = [
        f"Long-tailed generation: {N} requests, prompt {plen}, budgets log-normal (median {largest // 8}, "
        f"clipped to {largest}; {useful:,} tokens, longest {max(budgets)}), {slots} slots, best of {repeats} "
        f"interleaved calls after a warm-up\n",
        f"| engine | useful tokens/s | vs {ref_name} | by CPU time: tokens/s, vs {ref_name} | slot-steps per "
        "useful token | KV cache | peak KV in use |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in timed.items():
        last = r["last"]
        tps, cpu_tps = useful / r["best_seconds"], useful / r["best_cpu_seconds"]
        row = {
            "engine": name,
            "tokens_per_s": tps,
            "cpu_tokens_per_s": cpu_tps,
            "cpu_vs_static": cpu_tps / cpu_base,
            "median_tokens_per_s": useful / r["seconds"],
            "vs_static": tps / base,
            "slot_steps_per_token": last["slot_steps"] / useful,
            "cache_bytes": last["cache_bytes"],
            "in_use_bytes": last.get("in_use_bytes"),
            "seconds": r["all_seconds"],
        }
        rows.append(row)
        cache = "-" if row["cache_bytes"] is None else f"{row['cache_bytes'] / 2**20:.1f} MiB"
        in_use = "-" if row["in_use_bytes"] is None else f"{row['in_use_bytes'] / 2**20:.1f} MiB"
        lines.append(
            f"| {name} | {tps:,.0f} | {row['vs_static']:.2f}x | {cpu_tps:,.0f}, {row['cpu_vs_static']:.2f}x "
            f"| {row['slot_steps_per_token']:.2f} | {cache} | {in_use} |"
        )
    tunix_version = None
    if mode != "smoke" and tunix_python and Path(tunix_python).exists():
        from bench_common import child_json

        d = child_json(
            [tunix_python, __file__, "--only", "tunix", "--longtail", "--checkpoint", str(path)]
            + (["--quick"] if mode == "quick" else [])
        )
        tunix_version = d["version"]
        tps, paired = useful / d["tunix_seconds"], useful / d["marljax_seconds"]
        rows.append({"engine": "tunix sampler", "tokens_per_s": tps, "continuous_same_process": paired})
        lines.append(
            f"| tunix sampler (own process; marljax continuous beside it: {paired:,.0f}, "
            f"{paired / tps:.2f}x tunix) | {tps:,.0f} | - | - | - | - | - |"
        )
    else:
        lines.append(f"\n(tunix not measured: {tunix_python!r} not found, or smoke mode)")
    meta = {
        "tunix": tunix_version,
        "requests": N,
        "largest": largest,
        "prompt": plen,
        "slots": slots,
        "useful_tokens": useful,
        "transformers": hf_version,
    }
    return {"meta": meta, "rows": rows, "markdown": "\n".join(lines)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--batch", type=int, nargs="+")
    ap.add_argument("--prompt", type=int)
    ap.add_argument("--new", type=int)
    ap.add_argument("--repeats", type=int)
    ap.add_argument(
        "--tunix-python",
        default=TUNIX_PYTHON,
        help="python of a venv with google-tunix installed ('' to skip tunix)",
    )
    ap.add_argument("--checkpoint", default=DEFAULT_CKPT)
    ap.add_argument("--json", default=os.path.join(tempfile.gettempdir(), "marljax_bench_generate.json"))
    ap.add_argument("--only", choices=["marljax", "transformers", "tunix"], help=argparse.SUPPRESS)
    ap.add_argument("--longtail", action="store_true", help="only the long-tailed workload")
    ap.add_argument(
        "--paged", type=int, nargs="*", default=[], help="long-tailed: page sizes of paged-cache rows"
    )
    ap.add_argument(
        "--paged-pool", type=float, help="long-tailed: also a paged row with this fraction of the dense pages"
    )
    ap.add_argument("--no-static", action="store_true", help="long-tailed: leave out the static rows")
    ap.add_argument(
        "--no-transformers",
        action="store_true",
        help="long-tailed workload without transformers (at the full size a call of its lockstep batches "
        "takes about half an hour on CPU)",
    )
    args = ap.parse_args()
    if args.longtail and args.only == "tunix":  # child process in tunix's environment
        print("JSON:" + json.dumps(longtail_tunix("quick" if args.quick else "full", args.checkpoint)))
        return
    if args.longtail:
        out = run_longtail(
            "quick" if args.quick else "full",
            args.checkpoint,
            with_transformers=not args.no_transformers,
            tunix_python=args.tunix_python,
            paged=tuple(args.paged),
            paged_pool=args.paged_pool,
            static=not args.no_static,
            repeats=args.repeats,
        )
        print(out["markdown"])
        print(
            f"\n{platform.platform()}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M')} UTC, "
            f"load average {tuple(round(x, 2) for x in os.getloadavg())}"
        )
        return
    if args.only:  # child process: JSON on stdout
        path = make_checkpoint(Path(args.checkpoint))
        print(
            "JSON:"
            + json.dumps(measure_pair(args.only, path, args.batch, args.prompt, args.new, args.repeats))
        )
        return
    out = run(
        "quick" if args.quick else "full",
        args.tunix_python,
        args.checkpoint,
        args.batch,
        args.prompt,
        args.new,
        args.repeats,
    )
    out["meta"].update(
        machine=platform.platform(),
        cpus=os.cpu_count(),
        python=platform.python_version(),
        date=time.strftime("%Y-%m-%d %H:%M"),
        load_average=os.getloadavg(),
    )
    print(out["markdown"])
    Path(args.json).write_text(json.dumps(out, indent=2))
    print(f"\nload average {tuple(round(x, 2) for x in os.getloadavg())}; JSON written to {args.json}")


if __name__ == "__main__":
    main()
