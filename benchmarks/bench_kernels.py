"""RL kernels over 1 M tokens: marljax (jitted) vs verl's torch implementations vs NumPy.

    python benchmarks/bench_kernels.py [--quick] [--verl-python /tmp/verlenv/bin/python]

One pass of what a GRPO update computes besides the model, on N sequences of
L tokens (default 1024 x 1024, groups of 8, response lengths uniform in
[L/16, L]):

  1. GRPO outcome advantages, (r - mean_g) / (std_g + 1e-6) per group, per sequence;
  2. PPO clipped policy loss with dual clip (clip 0.2, c = 3; verl's "vanilla"),
     token-mean, with verl's metrics (clip fraction, approximate KL, lower clip fraction);
  3. k3 KL penalty to a reference (verl's "low_var_kl", clamped to [-10, 10]),
     aggregated token-mean.

- marljax: `grpo_advantages`, `policy_loss(dual_clip=3)`, `kl_penalty("k3", clamp=10)`,
  `aggregate_loss` in one `jax.jit`;
- verl (`verl.trainer.ppo.core_algos`): `compute_grpo_outcome_advantage` (verl's
  default "grpo" estimator, a Python loop over sequences), `compute_policy_loss_vanilla`,
  `kl_penalty`, `agg_loss`; and the same with `compute_grpo_vectorized_outcome_advantage`;
- numpy: a plain vectorised reference written here.

The three are checked to agree before timing. Everything runs in one process,
calls interleaved: verl needs its own virtual environment (`--verl-python`,
made with `--system-site-packages` so it also sees jax and marljax); without
it verl is skipped. torch gets one thread per core (or CUDA when it has it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from bench_common import child_json, emit_json, fmt, interleaved  # noqa: E402

CLIP, CLIP_C, KL_CLAMP, EPS = 0.2, 3.0, 10.0, 1e-6
VERL_PYTHON = "/tmp/verlenv/bin/python"


def make_inputs(N: int, L: int, G: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(max(1, L // 16), L + 1, size=N)
    mask = np.arange(L)[None, :] < lengths[:, None]
    logp_old = -rng.exponential(1.0, size=(N, L)).astype(np.float32)
    logp = (logp_old + 0.1 * rng.standard_normal((N, L))).astype(np.float32)
    ref = (logp_old + 0.1 * rng.standard_normal((N, L))).astype(np.float32)
    return dict(
        rewards=rng.integers(0, 2, size=N).astype(np.float32) * rng.random(N).astype(np.float32),
        group_ids=np.repeat(np.arange(N // G), G).astype(np.int32),
        num_groups=N // G,
        logp=logp,
        logp_old=logp_old,
        ref_logp=ref,
        mask=mask,
        lengths=lengths,
    )


# ------------------------------------------------------------------- numpy
def numpy_pipeline(x: dict) -> dict:
    r, g, m = x["rewards"], x["group_ids"], x["mask"]
    count = np.bincount(g, minlength=x["num_groups"]).astype(np.float32)
    mean = np.bincount(g, r, minlength=x["num_groups"]) / count
    var = np.bincount(g, (r - mean[g]) ** 2, minlength=x["num_groups"]) / np.maximum(count - 1, 1)
    adv = ((r - mean[g]) / (np.sqrt(var[g]) + EPS)).astype(np.float32)
    a = adv[:, None]
    neg_kl = np.clip(x["logp"] - x["logp_old"], -20, 20)
    ratio = np.exp(neg_kl)
    l1, l2 = -a * ratio, -a * np.clip(ratio, 1 - CLIP, 1 + CLIP)
    clipped = np.maximum(l1, l2)
    pg = np.where(a < 0, np.minimum(-a * CLIP_C, clipped), clipped)
    n = m.sum()
    d = np.clip(x["ref_logp"] - x["logp"], -20, 20)
    kl = np.clip(np.exp(d) - d - 1, -KL_CLAMP, KL_CLAMP)
    return {
        "adv": adv,
        "pg_loss": float((pg * m).sum() / n),
        "kl_loss": float((kl * m).sum() / n),
        "clip_frac": float(((l2 > l1) * m).sum() / n),
        "ppo_kl": float((-neg_kl * m).sum() / n),
    }


# ------------------------------------------------------------------- marljax
def setup_marljax(x: dict):
    import functools

    import jax
    import jax.numpy as jnp

    from marljax import kernels

    @functools.partial(jax.jit, static_argnames="num_groups")
    def pipeline(rewards, group_ids, logp, logp_old, ref_logp, mask, num_groups):
        adv = kernels.grpo_advantages(rewards, group_ids, num_groups, eps=EPS)
        pg, metrics = kernels.policy_loss(
            logp, logp_old, adv, mask, clip_low=CLIP, clip_high=CLIP, dual_clip=CLIP_C, agg_mode="token-mean"
        )
        kl = kernels.aggregate_loss(
            kernels.kl_penalty(logp, ref_logp, "k3", clamp=KL_CLAMP), mask, "token-mean"
        )
        return adv, pg, kl, metrics

    args = {k: jnp.asarray(x[k]) for k in ("rewards", "group_ids", "logp", "logp_old", "ref_logp", "mask")}

    def call():
        adv, pg, kl, m = jax.block_until_ready(pipeline(**args, num_groups=x["num_groups"]))
        return {
            "adv": adv,
            "pg_loss": pg,
            "kl_loss": kl,
            "clip_frac": m["clip_frac"],
            "ppo_kl": m["approx_kl"],
        }

    return call


# ------------------------------------------------------------------- verl
def import_verl():
    try:
        import ray  # noqa: F401
    except ImportError:  # verl imports ray at module level; nothing used here calls it

        class _Stub(types.ModuleType):
            def __getattr__(self, name):
                if name.startswith("__"):
                    raise AttributeError(name)
                return type(name, (), {"__init__": lambda self, *a, **k: None})

        sys.modules["ray"] = _Stub("ray")
    import importlib.metadata

    import verl.trainer.ppo.core_algos as ca
    from verl.workers.config import ActorConfig

    return ca, ActorConfig, importlib.metadata.version("verl")


def setup_verl(x: dict, vectorized: bool):
    import torch

    ca, ActorConfig, _ = import_verl()
    torch.set_num_threads(os.cpu_count() or 1)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = ActorConfig(
        strategy="fsdp", rollout_n=8, clip_ratio=CLIP, clip_ratio_c=CLIP_C, ppo_micro_batch_size_per_gpu=1
    )
    N, L = x["logp"].shape
    token_rewards = np.zeros((N, L), np.float32)
    token_rewards[np.arange(N), x["lengths"] - 1] = x["rewards"]  # outcome reward on the last token
    t = {k: torch.from_numpy(np.ascontiguousarray(x[k])).to(dev) for k in ("logp", "logp_old", "ref_logp")}
    mask = torch.from_numpy(x["mask"]).float().to(dev)
    token_rewards = torch.from_numpy(token_rewards).to(dev)
    index = x["group_ids"]
    estimator = (
        ca.compute_grpo_vectorized_outcome_advantage if vectorized else ca.compute_grpo_outcome_advantage
    )

    def call():
        adv, _ = estimator(token_rewards, mask, index, epsilon=EPS)
        pg, metrics = ca.compute_policy_loss_vanilla(t["logp_old"], t["logp"], adv, mask, "token-mean", cfg)
        kl = ca.agg_loss(ca.kl_penalty(t["logp"], t["ref_logp"], "low_var_kl"), mask, "token-mean")
        if dev == "cuda":
            torch.cuda.synchronize()
        return {
            "adv": adv[:, 0].cpu(),
            "pg_loss": pg.item(),
            "kl_loss": kl.item(),
            "clip_frac": metrics["actor/pg_clipfrac"],
            "ppo_kl": metrics["actor/ppo_kl"],
        }

    return call


# ------------------------------------------------------------------- driver
def check_close(ref: dict, other: dict, name: str) -> float:
    """Largest relative difference of `other` from the NumPy reference; raises above 1e-4."""
    worst = 0.0
    for k, v in ref.items():
        a, b = np.asarray(v, np.float64), np.asarray(other[k], np.float64)
        err = float(np.max(np.abs(a - b) / np.maximum(np.abs(a), 1e-3)))
        if not err <= 1e-4:
            raise AssertionError(f"{name}: {k} differs from the NumPy reference (relative {err:.2e})")
        worst = max(worst, err)
    return worst


def measure(N: int, L: int, G: int, repeats: int, with_verl: bool) -> dict:
    x = make_inputs(N, L, G)
    calls = {"marljax": setup_marljax(x), "numpy": lambda: numpy_pipeline(x)}
    version = None
    if with_verl:
        calls["verl"] = setup_verl(x, vectorized=False)
        calls["verl_vectorized"] = setup_verl(x, vectorized=True)
        version = import_verl()[2]
    ref = calls["numpy"]()
    errors = {name: check_close(ref, fn(), name) for name, fn in calls.items() if name != "numpy"}
    res = interleaved(calls, repeats, warmup=1)
    tokens = int(x["mask"].sum())
    out = {
        "sequences": N,
        "length": L,
        "group_size": G,
        "tokens": N * L,
        "valid_tokens": tokens,
        "verl_version": version,
        "max_rel_diff_vs_numpy": errors,
        "repeats": repeats,
    }
    for name, r in res.items():
        out[name] = {
            "seconds": r["seconds"],
            "best_seconds": r["best_seconds"],
            "all_seconds": r["all_seconds"],
            "tokens_per_s": N * L / r["seconds"],
        }
    for name in res:
        if name != "marljax":
            out[f"speedup_vs_{name}"] = res[name]["seconds"] / res["marljax"]["seconds"]
            out[f"speedup_best_vs_{name}"] = res[name]["best_seconds"] / res["marljax"]["best_seconds"]
    return out


SHAPES = {"smoke": (64, 128, 8, 2), "quick": (1024, 1024, 8, 3), "full": (1024, 1024, 8, 7)}


def run(mode: str = "full", verl_python: str = VERL_PYTHON) -> dict:
    N, L, G, repeats = SHAPES[mode]
    if verl_python and Path(verl_python).exists():
        out = child_json([verl_python, __file__, "--child", "--mode", mode])
    else:
        out = measure(N, L, G, repeats, with_verl=False)
        out["verl_skipped"] = f"no python at {verl_python!r}" if verl_python else "no verl environment given"
    names = [n for n in ("marljax", "numpy", "verl", "verl_vectorized") if n in out]
    lines = [
        f"GRPO advantages + PPO dual-clip loss + k3 KL + token-mean aggregation, {N} x {L} tokens "
        f"(groups of {G}), float32, median of {out['repeats']} interleaved calls"
        + (f"; verl {out['verl_version']}" if out.get("verl_version") else "")
        + (f"; verl skipped ({out['verl_skipped']})" if out.get("verl_skipped") else "")
        + ".\n",
        "| implementation | ms | M tokens/s | marljax speed-up (best of each) | max rel. diff vs NumPy |",
        "|---|---|---|---|---|",
    ]
    for n in names:
        sp = (
            "-"
            if n == "marljax"
            else f"**{out[f'speedup_vs_{n}']:.1f}x** ({out[f'speedup_best_vs_{n}']:.1f}x)"
        )
        err = out["max_rel_diff_vs_numpy"].get(n)
        lines.append(
            f"| {n} | {fmt(out[n]['seconds'] * 1e3, 1)} | {out[n]['tokens_per_s'] / 1e6:,.1f} | {sp} "
            f"| {'reference' if n == 'numpy' else f'{err:.1e}'} |"
        )
    out["markdown"] = "\n".join(lines)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--mode", choices=sorted(SHAPES))
    ap.add_argument("--verl-python", default=VERL_PYTHON)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    mode = args.mode or ("quick" if args.quick else "full")
    if args.child:
        N, L, G, repeats = SHAPES[mode]
        emit_json(measure(N, L, G, repeats, with_verl=True))
        return
    out = run(mode, args.verl_python)
    print(out.pop("markdown"))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
