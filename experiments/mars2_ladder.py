"""MARS2 ladder at toy scale: single-agent GRPO vs a homogeneous vs a heterogeneous team, judged by search.

    PYTHONPATH=. python experiments/mars2_ladder.py --seeds 0 1 2 3 4 [--steps 24 --batch 8]

MARS2 (arXiv 2602.07848) claims single agent < homogeneous team < heterogeneous
team, because models of different families make different errors and one can
repair the other's. Here the heterogeneity is made real at toy scale: the
embedded demo's two tiny models of different families (a 4-layer Qwen3 and a
3-layer Llama, `marljax.demo.models`, one tokenizer) are warm-started as the
demo does (`marljax.demo.pipeline.warm_start`), by SFT on two teachers with
*disjoint* habits (`marljax.demo.teacher.HABITS`): each writes the reference
program of a synthetic "steps" task but, in `SLIP_RATE` of the lines of *its
own* four operation kinds, makes the classic slip for that kind
(`marljax.demo.teacher.SLIPS`); lines of the other teacher's kinds are always
right. So the Qwen3 learns to slip on floor division, subtraction, `max` and
squaring, the Llama on `min`, multiplication, modulo and `abs`; the script
checks that the warm starts' errors really differ (pass rate per kind, slips
seen in their greedy programs, overlap of failed tasks).

Four settings at equal sample budgets (the demo's `METHODS` and run configs,
`marljax.demo.pipeline.run_config`: 8 problems x 8 samples per step): GRPO on the
Qwen3 alone, MARS2 with two agents on the Qwen3, MARS2 with the Qwen3 and the
Llama; and a homogeneous team of the other family (two agents on the Llama), so
the heterogeneous team meets a homogeneous team of each of its members. Before
and after RL, on `N_EVAL` held-out tasks (one fixed set for every seed and
setting):

* (i) each policy's greedy pass@1 (all tests);
* (ii) the team's MARS2-T+ solve rate, the demo's headline measurement
  (`marljax.demo.pipeline.team_search`): `NODES` nodes per task, public tests
  guide the search and pick the answer, hidden tests score it, sampled at the
  training temperature (1);
* (iii) pass@k of `K` samples per task (a team splits them evenly over its
  agents) and their diversity (`marljax.workflows.diversity`: distinct
  programs and AST-shape buckets per task).

The seeds vary RL (sampling, task order, search draws); one warm start per
family serves every seed. Writes docs/fidelity/mars2_ladder.json and .png.
"""

from __future__ import annotations

import gc
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

from marljax.demo.models import ensure_models, steps_problems  # noqa: E402
from marljax.demo.pipeline import METHODS, DemoConfig, run_config, team_search  # noqa: E402
from marljax.demo.pipeline import warm_start as pipeline_warm_start  # noqa: E402
from marljax.demo.teacher import HABITS, KINDS, SLIPS, line_kind  # noqa: E402
from marljax.rewards import SandboxPool, extract_code  # noqa: E402
from marljax.train.loop import Trainer  # noqa: E402
from marljax.workflows.diversity import grouped_diversity  # noqa: E402

SLIP_RATE = DemoConfig.teacher_slips  # the demo's habit teachers
WARM_SEED = 0
# held-out tasks from here: apart from RL (0..), SFT (500,000..), the demo's eval (1,000,000..) and
# tokenizer (10,000,000..) tasks, and the same for every seed and setting
EVAL_SEED = 2_000_000
N_EVAL = 128
K = 8  # samples per task for pass@k, and the search's node budget: equal generations
NODES = K
SETTINGS = {  # the demo's three, with a homogeneous team of each family
    "grpo": METHODS["grpo"],
    "mars2_homogeneous": METHODS["mars2_homogeneous"],
    "mars2_homogeneous_llama": {"alice": "llama", "bob": "llama"},
    "mars2_heterogeneous": METHODS["mars2_heterogeneous"],
}
PASS_AT_K_SEED = 500_000  # + the run's seed: the sampling seed of the pass@k samples


def task_kind(problem: Any) -> str | None:
    """The slip kind of a one-step task's operation (None: "add", which has no slip)."""
    return next(filter(None, map(line_kind, problem.fields["solution"].splitlines())), None)


def slipped_kinds(code: str, reference: str) -> list[str]:
    """Kinds whose reference line appears in `code` in its slipped form (the teacher's habit)."""
    out = []
    for line in reference.splitlines():
        kind = line_kind(line)
        if kind is not None:
            pattern, wrong = SLIPS[KINDS.index(kind)]
            if re.sub(pattern, wrong, line).strip() in {s.strip() for s in code.splitlines()}:
                out.append(kind)
    return out


def release_programs() -> None:
    """Drop JAX's compiled programs after a run. XLA:CPU maps each one into memory and JAX keeps them
    all alive, so one process running every run passes the kernel's 65,530-mapping limit (a run from
    scratch aborted in LLVM with "Cannot allocate memory"); the persistent compilation cache set in
    `main` reloads them cheaply."""
    jax.clear_caches()
    gc.collect()


def settings(seed: int, steps: int, batch: int) -> DemoConfig:
    return DemoConfig(seed=seed, rl_steps=steps, problems_per_step=batch)


def warm_start(root: Path) -> dict[str, Path]:
    """The demo's warm start: each family SFT'd on its own habit teacher, exported once."""
    s = settings(WARM_SEED, 1, 8)  # the demo's SFT settings (its RL fields are not used here)
    with SandboxPool(max_workers=1) as pool:  # one core
        bases = ensure_models(root / "models", pool, seed=WARM_SEED)
    return pipeline_warm_start(root, bases, s)


def measure(trainer: Trainer, problems: list, seed: int) -> dict:
    """(i)-(iii) of the module doc for the trainer's agents as one team, at its current parameters."""
    agents = list(trainer.agents.values())
    by_policy = {p: next(a for a in agents if a.policy == p) for p in sorted({a.policy for a in agents})}
    out: dict[str, Any] = {"policies": {}}
    for policy, agent in by_policy.items():
        gens = trainer.eval_generator.generate([(agent, agent.render(p.prompt)) for p in problems], 1, 0)
        codes = [g[0].text for g in gens]
        scores = trainer.verifier.score(problems, codes)
        out["policies"][policy] = {
            "greedy_passed": [bool(s.passed) for s in scores],
            "slipped": [
                slipped_kinds(extract_code(c).code, p.fields["solution"]) for c, p in zip(codes, problems)
            ],
        }
    # pass@k and diversity: K samples per task, split evenly over the team's agents
    per = K // len(agents)
    gens = trainer.generator.generate(
        [(a, a.render(p.prompt)) for a in agents for p in problems], per, PASS_AT_K_SEED + seed
    )
    texts = [
        [g.text for j in range(len(agents)) for g in gens[j * len(problems) + i]]
        for i in range(len(problems))
    ]
    passed = trainer.verifier.score(
        [p for p, t in zip(problems, texts) for _ in t], [x for t in texts for x in t]
    )
    passed = np.array([s.passed for s in passed]).reshape(len(problems), -1)
    out["pass_at_k"] = float(passed.any(axis=1).mean())
    out["sample_pass_rate"] = float(passed.mean())
    out.update(grouped_diversity([[extract_code(x).code or x for x in t] for t in texts], "diversity"))
    team = (problems, agents, trainer.generator, trainer.verifier)
    out["search"] = team_search(*team, NODES, seed, label=f"search, seed {seed}")
    return out


def run_one(seed: int, method: str, steps: int, root: Path, batch: int, models: dict[str, Path]) -> dict:
    s = settings(seed, steps, batch)
    cfg = run_config(method, root / "ladder" / f"{method}_seed{seed}", models, SETTINGS[method], s)
    shutil.rmtree(cfg.run_dir, ignore_errors=True)  # an interrupted attempt: start afresh, not resume
    problems = steps_problems(N_EVAL, EVAL_SEED, s.max_steps_per_task)
    trainer = Trainer(cfg)
    try:
        t0 = time.time()
        before = measure(trainer, problems, seed)
        t1 = time.time()
        trainer.run()
        t2 = time.time()
        after = measure(trainer, problems, seed)
    finally:
        trainer.close()
        release_programs()
    curve = [
        float(np.mean([v for k, v in m.items() if k.startswith("agent/") and k.endswith("/reward")]))
        for m in C.read_metrics(trainer.run_dir)
        if any(k.startswith("agent/") and k.endswith("/reward") for k in m)
    ]
    return {
        "seed": seed,
        "method": method,
        "agents": SETTINGS[method],
        "kinds": [task_kind(p) for p in problems],
        "before": before,
        "after": after,
        "reward_curve": curve,
        "samples": s.rl_steps * s.samples_per_step,
        "seconds": {"measure": t1 - t0, "rl": t2 - t1, "total": time.time() - t0},
    }


def team_metrics(m: dict) -> dict[str, float]:
    """The team-level numbers of one measurement."""
    return {
        "search_pass_at_1": m["search"]["eval/search/pass_at_1"],
        "search_oracle": m["search"]["eval/search/oracle"],
        "pass_at_k": m["pass_at_k"],
        "sample_pass_rate": m["sample_pass_rate"],
        "distinct_programs": m["diversity/distinct_programs"],
        "ast_buckets": m["diversity/algorithmic_variety"],
    }


def failure_overlap(passed_a: list[bool], passed_b: list[bool]) -> float:
    """Jaccard overlap of the tasks two policies fail (0 when neither fails any)."""
    a, b = ~np.array(passed_a), ~np.array(passed_b)
    return float((a & b).sum() / max((a | b).sum(), 1))


def error_profile(policies: dict[str, dict], kinds: list[str | None]) -> dict:
    """Do two policies' errors differ? Greedy pass rate on each family's habit kinds (and on tasks
    with no slip), the slips seen in their programs per kind, and the overlap of their failed tasks."""
    groups = {**{f"{f}_kinds": set(k) for f, k in HABITS.items()}, "no_slip_kinds": {None}}
    out: dict[str, Any] = {}
    for name, p in policies.items():
        ok = np.array(p["greedy_passed"])
        out[name] = {
            "pass": float(ok.mean()),
            **{f"pass_on_{g}": float(ok[[k in ks for k in kinds]].mean()) for g, ks in groups.items()},
            # per kind: share of that kind's tasks whose program holds the kind's classic slip
            "slip_rate": {
                kind: float(np.mean([kind in s for s, k in zip(p["slipped"], kinds) if k == kind]))
                for kind in KINDS
                if kind in kinds
            },
        }
    if len(policies) == 2:
        a, b = (~np.array(p["greedy_passed"]) for p in policies.values())
        out["failed_both"] = int((a & b).sum())
        out["failed_jaccard"] = failure_overlap(*(p["greedy_passed"] for p in policies.values()))
        out["team_greedy_coverage"] = float(np.mean(~(a & b)))  # some member passes
    return out


def summarise(runs: list[dict]) -> dict:
    """Per setting: before / after / gain of every team number and each policy's greedy pass@1,
    as 95% t intervals over seeds; the ladder's paired differences; the warm starts' error profile."""
    methods = [m for m in SETTINGS if any(r["method"] == m for r in runs)]
    out: dict[str, Any] = {"settings": {}, "ladder": {}}
    for method in methods:
        mine = sorted((r for r in runs if r["method"] == method), key=lambda r: r["seed"])
        s: dict[str, Any] = {}
        for key in team_metrics(mine[0]["before"]):
            b = [team_metrics(r["before"])[key] for r in mine]
            a = [team_metrics(r["after"])[key] for r in mine]
            s[key] = {
                "before": C.interval(b),
                "after": C.interval(a),
                "gain": C.interval(list(np.subtract(a, b))),
                "per_seed": {"before": b, "after": a},
            }
        for policy in mine[0]["before"]["policies"]:
            b = [float(np.mean(r["before"]["policies"][policy]["greedy_passed"])) for r in mine]
            a = [float(np.mean(r["after"]["policies"][policy]["greedy_passed"])) for r in mine]
            s[f"greedy_pass_at_1/{policy}"] = {
                "before": C.interval(b),
                "after": C.interval(a),
                "gain": C.interval(list(np.subtract(a, b))),
                "per_seed": {"before": b, "after": a},
            }
        s["chosen"] = {
            k.split("/")[2]: C.interval([r["after"]["search"][k] for r in mine])
            for k in mine[0]["after"]["search"]
            if k.endswith("/chosen")
        }
        n = min(len(r["reward_curve"]) for r in mine)
        s["reward_curve"] = np.mean([r["reward_curve"][:n] for r in mine], axis=0).tolist()
        out["settings"][method] = s
    # the ladder: paired by seed (same held-out tasks, same search seed)
    pairs = (
        ("mars2_homogeneous", "grpo"),
        ("mars2_heterogeneous", "mars2_homogeneous"),
        ("mars2_heterogeneous", "grpo"),
        ("mars2_heterogeneous", "mars2_homogeneous_llama"),
        ("mars2_homogeneous_llama", "mars2_homogeneous"),
    )
    for hi, lo in pairs:
        if hi in out["settings"] and lo in out["settings"]:
            for key in ("search_pass_at_1", "pass_at_k", "distinct_programs"):
                for phase in ("before", "after"):
                    h, low = (out["settings"][m][key]["per_seed"][phase] for m in (hi, lo))
                    if len(h) == len(low):
                        out["ladder"][f"{hi}-{lo}/{key}/{phase}"] = C.interval(list(np.subtract(h, low)))
    hetero = sorted((r for r in runs if r["method"] == "mars2_heterogeneous"), key=lambda r: r["seed"])
    if hetero:  # greedy decoding: the warm starts' profile is the same for every seed
        out["warm_errors"] = error_profile(hetero[0]["before"]["policies"], hetero[0]["kinds"])
        out["after_errors"] = [error_profile(r["after"]["policies"], r["kinds"]) for r in hetero]
    return out


LABELS = {
    "grpo": "GRPO (Qwen3)",
    "mars2_homogeneous": "MARS2 Qwen3 x2",
    "mars2_homogeneous_llama": "MARS2 Llama x2",
    "mars2_heterogeneous": "MARS2 Qwen3+Llama",
}
SHORT = {
    "grpo": "GRPO",
    "mars2_homogeneous": "homo",
    "mars2_homogeneous_llama": "homo Llama",
    "mars2_heterogeneous": "hetero",
}


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(17, 8.8))
    axes = axes.ravel()
    settings_ = summary["settings"]

    def bars(ax, rows, labels, title):
        xs = np.arange(len(rows))
        for phase, dx, color in (("before", -0.2, "C7"), ("after", 0.2, "C0")):
            mean = np.array([r[phase]["mean"] for r in rows])
            err = np.array(
                [[r[phase]["mean"] - r[phase]["lo"], r[phase]["hi"] - r[phase]["mean"]] for r in rows]
            )
            ax.bar(xs + dx, mean, 0.4, yerr=err.T, capsize=3, color=color, label=f"{phase} RL")
        ax.set_xticks(xs, labels, fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.set_ylabel("fraction of held-out tasks")
        ax.legend(fontsize=7)

    names = [LABELS[m] for m in settings_]
    bars(
        axes[0],
        [s["search_pass_at_1"] for s in settings_.values()],
        names,
        f"team MARS2-T+ solve rate ({NODES} nodes)",
    )
    bars(
        axes[1],
        [s["pass_at_k"] for s in settings_.values()],
        names,
        f"team pass@{K} (samples split over agents)",
    )
    bars(
        axes[2],
        [s["distinct_programs"] for s in settings_.values()],
        names,
        f"distinct programs among {K} samples",
    )
    rows = [
        (f"{SHORT[m]}: {k.split('/')[1]}", v) for m, s in settings_.items() for k, v in s.items() if "/" in k
    ]
    bars(axes[3], [v for _, v in rows], [label for label, _ in rows], "each policy's greedy pass@1")
    warm = summary.get("warm_errors")
    if warm:  # the habits: each warm start's greedy pass rate on each teacher's slip kinds
        ax, groups = axes[4], [g for g in warm["qwen3"] if g.startswith("pass_on_")]
        for k, model in enumerate(("qwen3", "llama")):
            ax.bar(
                np.arange(len(groups)) + (k - 0.5) * 0.4, [warm[model][g] for g in groups], 0.4, label=model
            )
        ax.set_xticks(
            np.arange(len(groups)), [g[len("pass_on_") :].replace("_", " ") for g in groups], fontsize=7
        )
        ax.set_ylabel("greedy pass rate")
        ax.set_title("warm starts: pass rate by task kind (whose teacher slips on it)", fontsize=9)
        ax.legend(fontsize=7)
    ax = axes[5]
    for k, (m, s) in enumerate(settings_.items()):
        curve = s["reward_curve"]
        ax.plot(np.arange(1, len(curve) + 1), curve, color=f"C{k}", label=LABELS[m])
    ax.set_xlabel("RL step")
    ax.set_ylabel("training reward (mean over agents and seeds)")
    ax.set_title("RL: training reward (sampled, all tests)", fontsize=9)
    ax.legend(fontsize=7)
    C.save_figure(fig, path)


def main(argv=None) -> None:
    ap = C.arguments(__doc__, steps=24, batch_help="problems per RL step (8 samples each)")
    ap.set_defaults(batch=8)
    args = ap.parse_args(argv)
    C.quiet()
    # the nine runs compile the same programs (the same two models, bucketed shapes): compile once
    jax.config.update("jax_compilation_cache_dir", str((args.root / "xla_cache").resolve()))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    t0 = time.time()
    models = None if args.summarise else warm_start(args.root)  # --summarise trains nothing
    print(f"warm start: {time.time() - t0:.0f} s", flush=True)
    runs = []
    for seed in args.seeds:
        for method in SETTINGS:
            done = args.root / "ladder" / f"{method}_seed{seed}_s{args.steps}_b{args.batch}.json"
            if args.summarise and not done.exists():
                continue
            runs.append(C.cached_run(done, run_one, seed, method, args.steps, args.root, args.batch, models))
            print(f"seed {seed} {method}: {runs[-1]['seconds']}", flush=True)
    summary = summarise(runs)
    C.write_json(
        args.out / "mars2_ladder.json",
        {
            "settings": {
                "seeds": sorted({r["seed"] for r in runs}),
                "steps": args.steps,
                "batch": args.batch,
                "samples_per_problem": DemoConfig().samples_per_problem,
                "habits": HABITS,
                "slip_rate": SLIP_RATE,
                "n_eval": N_EVAL,
                "k": K,
                "nodes": NODES,
                "sft_steps": DemoConfig().sft_steps,
            },
            "summary": summary,
            "runs": runs,
        },
    )
    plot(summary, args.out / "mars2_ladder.png")
    for method, s in summary["settings"].items():
        line = ", ".join(
            f"{k} {v['before']['mean']:.3f} -> {v['after']['mean']:.3f} "
            f"[{v['after']['lo']:.3f}, {v['after']['hi']:.3f}]"
            for k, v in s.items()
            if "before" in v
        )
        print(f"{method}: {line}")
    for k, v in summary["ladder"].items():
        print(f"{k}: {v['mean']:+.3f} [{v['lo']:+.3f}, {v['hi']:+.3f}]")


if __name__ == "__main__":
    main()
