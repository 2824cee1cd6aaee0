"""The heterogeneous MARS2 team under nine RL recipes, measured over RL checkpoints.

    PYTHONPATH=. python experiments/mars2_recipes.py --seeds 0 1 2 3 4 [--steps 24 --batch 8]
    PYTHONPATH=. python experiments/mars2_recipes.py --seeds 0 1 2 3 4 --recipes demo mars2_plus \
        --steps 40 --samples 32 --nodes 4 8 16 32 --name mars2_recipes_long

The MARS2 ladder (`experiments/mars2_ladder.py`) found the heterogeneous team
(the demo's Qwen3 and Llama, warm-started on teachers with disjoint habits)
searching *worse* after RL, with a recipe that differs from MARS2+'s in every
setting that could cause it: per-agent normalisation inside each tree (Dr.
MAS's) instead of one group per tree, a pass/fail reward instead of the
fraction of tests passed, one optimiser step per update (the ratio is 1 and no
clip acts), no KL to each agent's reference, no overlong penalty. Each recipe
here changes one of them from the demo's, or all at once:

* ``demo``: the demo's run config (`marljax.demo.pipeline.run_config`);
* ``tree``: one advantage group per tree (MARS2);
* ``kind``: a tree's fresh solutions and refinements in separate groups;
* ``kl``: k3 KL 1e-3 to each agent's reference;
* ``fraction``: the fraction-of-tests reward;
* ``mars2_plus``: MARS2+ (``configs/mars2_plus_tiny.yaml``'s recipe): one group per
  tree, fraction reward, GSPO with its sequence clip over 2 mini-batches, k3 KL
  1e-3, DAPO's overlong penalty;
* ``equal_budget``: the demo's recipe with twice the problems per step, so each
  of the team's two policies learns from as many samples a step as single-agent
  GRPO's one policy does in the ladder;
* ``kl_strong`` and ``half_lr``: the demo's recipe held nearer its warm start, by a
  k3 KL of 0.1 (the tool teams' setting) or at half the learning rates.

Every recipe starts from the same warm starts (`mars2_ladder.warm_start`) and,
for one seed, the same RL tasks and sampling seed. Measured on the ladder's
128 held-out tasks at the warm start (shared by every recipe of a seed), after
every `EVERY` RL steps for ``demo`` and ``mars2_plus``, and at the end for the
others:

* per policy: greedy pass@1 and, from `SAMPLES` samples per task at temperature 1,
  unbiased pass@k for k = 1..`SAMPLES`; the team's union pass@k with k/2
  samples from each policy; the overlap (Jaccard) of the two policies' greedy
  failures;
* the team's MARS2-T+ solve rate at each budget of `NODES` (`search_eval`, the
  function `marljax eval --search` runs, 2 expansions per round, sampled at
  temperature 1); at the largest budget, the share of fresh solutions (GEN) and
  of refinements (CONT) that pass the hidden tests.

Writes docs/fidelity/<name>.json and .png (`--name`, default mars2_recipes).
"""

from __future__ import annotations

import copy
import shutil
import sys
import time
from math import comb
from pathlib import Path
from typing import Any

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402
import mars2_ladder as L  # noqa: E402

from marljax.demo.models import steps_problems  # noqa: E402
from marljax.demo.pipeline import METHODS, run_config  # noqa: E402
from marljax.train.config import config_from_dict  # noqa: E402
from marljax.train.loop import Trainer  # noqa: E402
from marljax.workflows.mars2 import search_eval  # noqa: E402

TEAM = METHODS["mars2_heterogeneous"]
KL = {"kl_coef": 1e-3, "kl_estimator": "k3"}
GSPO = {
    "type": "gspo",
    "clip_low": 3e-4,
    "clip_high": 4e-4,
    "agg_mode": "seq-mean-token-mean",
    "tis_cap": 2.0,
}
RECIPES: dict[str, dict[str, Any]] = {
    "demo": {},
    "tree": {"workflow": {"normalization": "tree"}},
    "kind": {"workflow": {"normalization": "kind"}},
    "kl": {"policy": {"loss": KL, "reference": True}},
    "fraction": {"workflow": {"reward": "fraction"}},
    "mars2_plus": {
        "workflow": {
            "normalization": "tree",
            "reward": "fraction",
            "overlong": {"max_len": 40, "buffer_len": 10},
        },
        "policy": {"loss": {**GSPO, **KL}, "reference": True, "mini_batches": 2},
    },
    "equal_budget": {"problems_per_step": 16},
    "kl_strong": {"policy": {"loss": {**KL, "kl_coef": 0.1}, "reference": True}},
    "half_lr": {"lr_scale": 0.5},
}
SERIES = ("demo", "mars2_plus")  # measured every EVERY steps; the others at the start and the end
EVERY = 8
SAMPLES = 16  # per policy and task, for pass@k
NODES = (4, 8, 16)
SAMPLE_SEED = 700_000  # + the run's seed: the pass@k samples' sampling seed


def recipe_config(recipe: str, seed: int, steps: int, batch: int, root: Path, models: dict[str, Path]):
    """The demo's run config of the heterogeneous team with the recipe's changes."""
    change = RECIPES[recipe]
    s = L.settings(seed, steps, change.get("problems_per_step", batch))
    base = run_config(recipe, root / "recipes" / f"{recipe}_seed{seed}", models, TEAM, s)
    d = base.model_dump(mode="json")
    d["workflow"].update(change.get("workflow", {}))
    for policy in d["policies"].values():
        policy["optimizer"]["lr"] *= change.get("lr_scale", 1.0)
        for key, value in change.get("policy", {}).items():
            if key == "loss" and value.get("type", policy["loss"]["type"]) != policy["loss"]["type"]:
                policy["loss"] = copy.deepcopy(value)  # another loss: none of the old one's fields
            elif isinstance(value, dict):
                policy[key].update(value)
            else:
                policy[key] = value
    return config_from_dict(d)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from c passing samples among n (Chen et al. 2021)."""
    return 1.0 - comb(n - c, k) / comb(n, k)


def measure(trainer: Trainer, problems: list, seed: int) -> dict[str, Any]:
    agents = list(trainer.agents.values())
    out: dict[str, Any] = {"greedy": {}, "passed": {}}
    for agent in agents:
        gens = trainer.eval_generator.generate([(agent, agent.render(p.prompt)) for p in problems], 1, 0)
        scores = trainer.verifier.score(problems, [g[0].text for g in gens])
        out["greedy"][agent.name] = [bool(s.passed) for s in scores]
        gens = trainer.generator.generate(
            [(agent, agent.render(p.prompt)) for p in problems], SAMPLES, SAMPLE_SEED + seed
        )
        scores = trainer.verifier.score(
            [p for p in problems for _ in range(SAMPLES)], [g.text for row in gens for g in row]
        )
        out["passed"][agent.name] = (
            np.array([s.passed for s in scores]).reshape(len(problems), SAMPLES).sum(1).tolist()
        )
    out["search"] = {  # keyed by str: the same after a JSON round trip
        str(nodes): search_eval(
            problems,
            agents,
            trainer.generator,
            trainer.verifier,
            max_nodes=nodes,
            expansions_per_round=2,
            seed=seed,
        )
        for nodes in NODES
    }
    return out


def numbers(m: dict[str, Any]) -> dict[str, float]:
    """A measurement's scalars: per-policy and team pass@k, failure overlap, search rates."""
    out: dict[str, float] = {}
    counts = list(m["passed"].values())
    ks = [2**j for j in range(SAMPLES.bit_length()) if 2**j <= SAMPLES]
    for name, c in m["passed"].items():
        out[f"greedy/{name}"] = float(np.mean(m["greedy"][name]))
        for k in ks:
            out[f"pass@{k}/{name}"] = float(np.mean([pass_at_k(SAMPLES, x, k) for x in c]))
    for k in ks:  # k samples from each policy
        miss = np.prod([[1 - pass_at_k(SAMPLES, x, k) for x in c] for c in counts], axis=0)
        out[f"team_pass@{2 * k}"] = float(np.mean(1 - miss))
    out["failed_jaccard"] = L.failure_overlap(*m["greedy"].values())
    for nodes, s in m["search"].items():
        out[f"search@{nodes}"] = s["eval/search/pass_at_1"]
        out[f"oracle@{nodes}"] = s["eval/search/oracle"]
    top = m["search"][str(max(NODES))]
    for kind in ("gen", "cont"):
        out[f"{kind}_success"] = top.get(f"eval/search/{kind}_success", float("nan"))
        out[f"{kind}_nodes"] = top[f"eval/search/{kind}_nodes"]
    return out


def measured_as() -> str:
    """The measurement's settings, in the names of the files it is cached in."""
    return f"k{SAMPLES}_n{'-'.join(map(str, NODES))}"


def run_one(seed: int, recipe: str, steps: int, root: Path, batch: int, models: dict[str, Path]) -> dict:
    cfg = recipe_config(recipe, seed, steps, batch, root, models)
    shutil.rmtree(cfg.run_dir, ignore_errors=True)
    problems = steps_problems(L.N_EVAL, L.EVAL_SEED, L.settings(seed, steps, batch).max_steps_per_task)
    trainer = Trainer(cfg)
    measured, history, t0 = {}, [], time.time()
    try:
        # the warm start's measurement is the same for every recipe of a seed: made once
        before = root / "recipes" / f"before_seed{seed}_{measured_as()}.json"
        measured["0"] = numbers(C.cached_run(before, measure, trainer, problems, seed))
        while trainer.step < steps:
            history.append(trainer.train_step())
            if trainer.step == steps or (recipe in SERIES and trainer.step % EVERY == 0):
                measured[str(trainer.step)] = numbers(measure(trainer, problems, seed))
    finally:
        trainer.close()
        L.release_programs()
    return {
        "seed": seed,
        "recipe": recipe,
        "workflow": cfg.workflow.model_dump(mode="json"),
        "losses": {name: p.loss.model_dump(mode="json") for name, p in cfg.policies.items()},
        "measured": measured,
        "history": history,
        "seconds": time.time() - t0,
    }


def summarise(runs: list[dict]) -> dict:
    """Per recipe and checkpoint, every number as a 95% t interval over seeds; the change from the
    warm start and the difference from the demo's recipe, both paired by seed."""
    out: dict[str, Any] = {}
    for recipe in RECIPES:
        mine = sorted((r for r in runs if r["recipe"] == recipe), key=lambda r: r["seed"])
        if not mine:
            continue
        steps = sorted(set.intersection(*(set(r["measured"]) for r in mine)), key=int)
        rows: dict[str, Any] = {}
        for step in steps:
            row = {}
            for key in mine[0]["measured"][step]:
                values = [r["measured"][step][key] for r in mine]
                row[key] = {**C.interval(values), "per_seed": values}
                if step != steps[0]:
                    start = [r["measured"][steps[0]][key] for r in mine]
                    row[key]["gain"] = C.interval(list(np.subtract(values, start)))
            rows[step] = row
        curve = [
            [
                np.mean([h[k] for k in h if k.startswith("agent/") and k.endswith("/reward")])
                for h in r["history"]
            ]
            for r in mine
        ]
        out[recipe] = {
            "seeds": [r["seed"] for r in mine],
            "at": rows,
            "reward_curve": np.mean(curve, axis=0).tolist(),
        }
    if "demo" in out:
        demo = {r["seed"]: r for r in runs if r["recipe"] == "demo"}
        for recipe, s in out.items():
            last = max(s["at"], key=int)
            pairs = [
                r
                for r in runs
                if r["recipe"] == recipe and r["seed"] in demo and last in demo[r["seed"]]["measured"]
            ]
            if recipe != "demo" and len(pairs) > 1:
                s["minus_demo"] = {
                    key: C.interval(
                        [r["measured"][last][key] - demo[r["seed"]]["measured"][last][key] for r in pairs]
                    )
                    for key in pairs[0]["measured"][last]
                }
    return out


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(17, 9))
    axes = axes.ravel()

    def bars(ax, key, title):
        names = list(summary)
        last = [summary[n]["at"][max(summary[n]["at"], key=int)][key] for n in names]
        first = [summary[n]["at"][min(summary[n]["at"], key=int)][key] for n in names]
        xs = np.arange(len(names))
        for rows, dx, color, label in ((first, -0.2, "C7", "warm start"), (last, 0.2, "C0", "after RL")):
            mean = np.array([r["mean"] for r in rows])
            err = np.array([[r["mean"] - r["lo"], r["hi"] - r["mean"]] for r in rows]).T
            ax.bar(xs + dx, mean, 0.4, yerr=err, capsize=3, color=color, label=label)
        ax.set_xticks(xs, names, fontsize=8, rotation=20)
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7, loc="lower right")

    bars(axes[0], f"search@{NODES[1]}", f"team MARS2-T+ solve rate, {NODES[1]} nodes (95% CI)")
    bars(axes[1], f"search@{NODES[-1]}", f"team MARS2-T+ solve rate, {NODES[-1]} nodes (95% CI)")
    bars(axes[2], "team_pass@16", "team union pass@16 (8 samples per policy)")
    for ax, key, title in (
        (axes[3], f"search@{NODES[1]}", f"search@{NODES[1]} over RL"),
        (axes[4], "failed_jaccard", "overlap of the two policies' greedy failures"),
    ):
        for k, recipe in enumerate(SERIES):
            if recipe in summary:
                at = summary[recipe]["at"]
                xs = sorted(at, key=int)
                mean = np.array([at[x][key]["mean"] for x in xs])
                lo, hi = (np.array([at[x][key][b] for x in xs]) for b in ("lo", "hi"))
                steps = [int(x) for x in xs]
                ax.plot(steps, mean, marker="o", color=f"C{k}", label=recipe)
                ax.fill_between(steps, lo, hi, color=f"C{k}", alpha=0.15)
        ax.set_xlabel("RL step")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    ax = axes[5]
    for k, (recipe, s) in enumerate(summary.items()):
        curve = np.convolve(s["reward_curve"], np.ones(4) / 4, mode="valid")
        ax.plot(np.arange(4, len(curve) + 4), curve, color=f"C{k}", label=recipe)
    ax.set_xlabel("RL step")
    ax.set_title("training reward, mean over agents and seeds (4-step moving average)", fontsize=9)
    ax.legend(fontsize=7, bbox_to_anchor=(1.0, 1.0), loc="upper left")
    C.save_figure(fig, path)


def main(argv=None) -> None:
    global SAMPLES, NODES  # the measurement's settings, from the options
    ap = C.arguments(__doc__, steps=24, batch_help="problems per RL step (8 nodes each)")
    ap.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    ap.add_argument("--samples", type=int, default=SAMPLES, help="per policy and task, for pass@k")
    ap.add_argument("--nodes", type=int, nargs="+", default=list(NODES), help="search budgets")
    ap.add_argument("--name", default="mars2_recipes", help="the JSON's and PNG's file name")
    ap.set_defaults(batch=8)
    args = ap.parse_args(argv)
    SAMPLES, NODES = args.samples, tuple(args.nodes)
    C.quiet()
    jax.config.update("jax_compilation_cache_dir", str((args.root / "xla_cache").resolve()))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    models = None if args.summarise else L.warm_start(args.root)
    runs = []
    for seed in args.seeds:
        for recipe in args.recipes:
            done = (
                args.root
                / "recipes"
                / f"{recipe}_seed{seed}_s{args.steps}_b{args.batch}_{measured_as()}.json"
            )
            if args.summarise and not done.exists():
                continue
            runs.append(C.cached_run(done, run_one, seed, recipe, args.steps, args.root, args.batch, models))
            print(f"seed {seed} {recipe}: {runs[-1]['seconds']:.0f} s", flush=True)
    summary = summarise(runs)
    settings = {
        "seeds": sorted({r["seed"] for r in runs}),
        "steps": args.steps,
        "batch": args.batch,
        "recipes": RECIPES,
        "samples": SAMPLES,
        "nodes": NODES,
        "n_eval": L.N_EVAL,
    }
    kept = ("/reward", "/clip_frac", "/kl_ref")
    runs = [  # the per-step records trimmed to what the summary and a reader of the curves need
        {**r, "history": [{k: v for k, v in h.items() if k.endswith(kept)} for h in r["history"]]}
        for r in runs
    ]
    C.write_json(args.out / f"{args.name}.json", {"settings": settings, "summary": summary, "runs": runs})
    plot(summary, args.out / f"{args.name}.png")
    for recipe, s in summary.items():
        last, first = max(s["at"], key=int), min(s["at"], key=int)
        parts = []
        for key in [f"search@{n}" for n in NODES] + ["team_pass@16", "failed_jaccard"]:
            a, b, g = s["at"][first][key], s["at"][last][key], s["at"][last][key]["gain"]
            parts.append(
                f"{key} {a['mean']:.3f} -> {b['mean']:.3f} ({g['mean']:+.3f} [{g['lo']:+.3f}, {g['hi']:+.3f}])"
            )
        print(recipe, "; ".join(parts), flush=True)


if __name__ == "__main__":
    main()
