"""SHARP's Shapley credit at toy scale: efficiency, symmetry and the null player on real rollouts.

    PYTHONPATH=. python experiments/sharp_axioms.py --seeds 0 1 2 [--batch 8]

SHARP (arXiv 2602.08335) credits each agent with its Shapley value over
counterfactual coalitions (an agent's output masked, the outcome re-evaluated).
Shapley values are the unique credit that is efficient (credits sum to
v(team) - v(empty)), symmetric (interchangeable agents get equal credit) and
gives a null player 0; the paper's practical form masks one agent at a time
(leave-one-out), which is not efficient in general. This script measures the
three properties on real rollouts of marljax's `sharp` workflow.

Per seed: the warm-started tiny policy (`experiments/_common.py`) plays a
planner and three workers (`workflow.sharp`, G episodes per problem, sampled at
T = 1); the workflow's own code builds every worker coalition's program
(`coalition_code`: the members' code in worker order, the others' masked) and
runs it in the sandbox (`SharpWorkflow._values`), and `team_value_table` adds the
planner as player 0. Two tables per episode:

* natural: planner + workers a, b, c as generated (efficiency, and the
  counterfactual option's efficiency gap);
* constructed: planner, a, a' (a duplicate of worker a, placed right after a so
  that every coalition with a alone and the same coalition with a' alone build
  the identical program: a and a' are interchangeable by construction), b, and
  a null worker n (worker c's real output with every line commented out, so
  any program it joins runs exactly as without it: the reward ignores it).
  Whether the properties hold *in the data* is checked too (a' and a give
  identical marginals, n's marginal is 0 in every coalition; episodes where the
  sandbox disagreed with itself are counted).

Credits: exact `kernels.shapley_values`, `kernels.sampled_shapley_values` through
the workflow's `shapley_credit` (antithetic permutations, as the workflow runs
them) at several permutation counts, and the counterfactual option
(`kernels.leave_one_out_credit`). The sampled estimator's error against exact is
its root-mean-square over players and episodes, over `--draws` independent keys.

Writes docs/fidelity/sharp_axioms.json and .png.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

from marljax.rewards import extract_code  # noqa: E402
from marljax.train.config import config_from_dict  # noqa: E402
from marljax.train.loop import Trainer  # noqa: E402
from marljax.workflows.sharp import coalition_code, shapley_credit, team_value_table  # noqa: E402

WORKERS = ("worker_a", "worker_b", "worker_c")
PERMUTATIONS = (1, 2, 4, 8, 16, 32)
G = 4
# Workers see "Coder. <task>", the prompt the warm start learned to answer with a program: with the
# plan and the workflow's worker instruction in the prompt (before or after the task) it wrote no
# program at all (every coalition value 0). "{history:.0}" and "{feedback:.0}" format as empty strings
# and name the fields, so `render_in_context` does not append them: each worker writes the whole
# program, blind to the plan, and the team's program is the workers' programs concatenated.
WORKER_TEMPLATE = "{role}{problem}{history:.0}{feedback:.0}"
TOL = 1e-5  # float32 sums of at most 32 table entries in [0, 1]


def config(seed: int, root: Path, batch: int):
    """A SHARP run on the warm start: a planner and three workers (coder prompts: the warm start
    was taught to write programs after "Coder. ")."""
    agents = {"planner": {"policy": "shared", "role": "Solve. ", "template": C.TEMPLATE}}
    for w in WORKERS:
        agents[w] = {"policy": "shared", "role": "Coder. ", "template": WORKER_TEMPLATE}
    return config_from_dict(
        {
            "name": f"sharp_axioms_seed{seed}",
            "run_dir": str(root / "sharp_axioms" / f"seed{seed}"),
            "seed": seed,
            "policies": {
                "shared": {
                    "model": {"path": str(C.warm_start(root=root))},
                    "chat": "off",
                    "optimizer": {"lr": 1e-3},
                    "buffer": {"threshold": 32},
                }
            },
            "agents": agents,
            "data": {
                "source": {
                    "kind": "synthetic",
                    "n_train": batch,
                    "n_eval": 1,
                    "difficulty": 1,
                    "style": "steps",
                    "seed": seed,
                },
                "batch_size": batch,
            },
            "sampler": {"max_new_tokens": 40, "temperature": 1.0, "min_prompt_bucket": 64},
            "workflow": {"kind": "sharp", "planner": "planner", "workers": list(WORKERS), "group_size": G},
            "train": {"steps": 1, "log_to": [], "progress": False},
        },
        source=f"<experiment sharp_axioms seed {seed}>",
    )


def commented(text: str) -> str:
    """A worker's code with every line turned into a comment: present in the program, never run."""
    code = extract_code(text).code
    return "\n".join("# " + line for line in code.splitlines())


def tables(seed: int, root: Path, batch: int) -> dict:
    """The natural and constructed coalition tables of one seed's rollout (module doc)."""
    trainer = Trainer(config(seed, root, batch))
    try:
        wf, t0 = trainer.workflow, time.time()
        trajs = wf._team(trainer.train_problems, trainer.agents, trainer.generator, seed, G)
        natural, _ = wf._values(trajs, trainer.verifier, [list(range(1 << len(WORKERS)))] * len(trajs))
        # constructed team: the workers' code becomes [a, a', b, n]; _values reads `codes` of each
        # trajectory and the number of workers of its config, so the constructed code list goes in
        # through a stand-in trajectory and a copy of the workflow with four worker names
        built = [_Built(t, [t.codes[0], t.codes[0], t.codes[1], commented(t.work[2].text)]) for t in trajs]
        four = type(wf)(wf.cfg.model_copy(update={"workers": ["a", "a_dup", "b", "null"]}))
        constructed, _ = four._values(built, trainer.verifier, [list(range(16))] * len(trajs))
        texts = [[coalition_code(b.codes, 15)] for b in built[:2]]  # two examples for the JSON
    finally:
        trainer.close()
    return {
        "seed": seed,
        "natural": np.stack([team_value_table(w) for w in natural]).tolist(),
        "constructed": np.stack([team_value_table(w) for w in constructed]).tolist(),
        "example_programs": texts,
        "seconds": time.time() - t0,
    }


class _Built:
    """A trajectory whose worker code list is replaced (what `SharpWorkflow._values` reads)."""

    def __init__(self, traj, codes):
        self.problem, self.group, self.codes = traj.problem, traj.group, codes


def properties(tables: np.ndarray) -> dict:
    """Whether the constructed tables have the properties by construction, in the data:
    players 0 planner, 1 a, 2 a', 3 b, 4 n. Counts of episodes where a coalition S (without a and
    a') gives v(S + a) != v(S + a'), or where some S without n gives v(S + n) != v(S)."""
    idx = np.arange(tables.shape[1])
    without_aa = idx[(idx & 0b110) == 0]
    asym = np.abs(tables[:, without_aa | 0b010] - tables[:, without_aa | 0b100]).max(1) > TOL
    without_n = idx[(idx & 0b10000) == 0]
    not_null = np.abs(tables[:, without_n | 0b10000] - tables[:, without_n]).max(1) > TOL
    return {"asymmetric_episodes": int(asym.sum()), "non_null_episodes": int(not_null.sum())}


def credits(tables: np.ndarray, seed: int, draws: int) -> dict:
    """Exact, counterfactual and sampled credit `[N, K]` (sampled: `[draws, P, N, K]`)."""
    n = len(tables)
    sampled = []
    for d in range(draws):
        row = []
        for p in PERMUTATIONS:
            keys = jax.vmap(
                lambda i, d=d, p=p: jax.random.fold_in(jax.random.PRNGKey(seed * 1000 + d), i * 64 + p)
            )(np.arange(n))
            row.append(shapley_credit(tables, "sampled", keys, p))
        sampled.append(row)
    return {
        "exact": shapley_credit(tables, "exact"),
        "counterfactual": shapley_credit(tables, "counterfactual"),
        "sampled": np.asarray(sampled),
    }


def axioms(tables: np.ndarray, cr: dict) -> dict:
    """Per-seed statistics: efficiency gaps (all tables), symmetry and null gaps (constructed)."""
    target = tables[:, -1] - tables[:, 0]
    out = {}
    for name in ("exact", "counterfactual"):
        gap = np.abs(cr[name].sum(-1) - target)
        out[f"efficiency_gap_max/{name}"] = float(gap.max())
        out[f"efficiency_gap_mean/{name}"] = float(gap.mean())
    gap = np.abs(cr["sampled"].sum(-1) - target)  # [draws, P, N]
    out["efficiency_gap_max/sampled"] = float(gap.max())
    exact = cr["exact"]
    err = cr["sampled"] - exact  # [draws, P, N, K]
    out["sampled_rmse"] = np.sqrt((err**2).mean(axis=(0, 2, 3))).tolist()  # per P
    out["credit_abs_mean/exact"] = float(np.abs(exact).mean())  # the scale the sampled error compares to
    out["episodes"] = len(tables)
    out["episodes_varying"] = int((np.ptp(tables, axis=1) > TOL).sum())
    return out


def constructed_axioms(tables: np.ndarray, cr: dict) -> dict:
    out = axioms(tables, cr)
    for name in ("exact", "counterfactual"):
        out[f"symmetry_gap_max/{name}"] = float(np.abs(cr[name][:, 1] - cr[name][:, 2]).max())
        out[f"null_abs_max/{name}"] = float(np.abs(cr[name][:, 4]).max())
    s = cr["sampled"]  # [draws, P, N, K]
    out["symmetry_gap_mean/sampled"] = np.abs(s[..., 1] - s[..., 2]).mean(axis=(0, 2)).tolist()  # per P
    out["null_abs_max/sampled"] = float(np.abs(s[..., 4]).max())
    out["credit_mean/exact"] = cr["exact"].mean(0).tolist()
    out.update(properties(tables))
    return out


def summarise(per_seed: list[dict]) -> dict:
    """Over seeds: the worst gaps (max over seeds) and intervals of the sampled error per P."""
    out = {"seeds": [s["seed"] for s in per_seed], "permutations": list(PERMUTATIONS)}
    for part in ("natural", "constructed"):
        rows = [s[part] for s in per_seed]
        keys = [k for k, v in rows[0].items() if isinstance(v, (int, float))]
        # worst case for gaps, mean of means, and counts of episodes added up
        out[part] = {
            k: max(r[k] for r in rows)
            if "max" in k
            else (np.mean if "mean" in k else sum)([r[k] for r in rows])
            for k in keys
        }
        out[part] = {k: float(v) if "episodes" not in k else int(v) for k, v in out[part].items()}
        out[part]["credit_abs_mean/exact"] = C.interval([r["credit_abs_mean/exact"] for r in rows])
        out[part]["sampled_rmse"] = [
            C.interval([r["sampled_rmse"][i] for r in rows]) for i in range(len(PERMUTATIONS))
        ]
        if part == "constructed":
            out[part]["symmetry_gap_mean/sampled"] = [
                C.interval([r["symmetry_gap_mean/sampled"][i] for r in rows])
                for i in range(len(PERMUTATIONS))
            ]
            out[part]["credit_mean/exact"] = [
                C.interval([r["credit_mean/exact"][k] for r in rows]) for k in range(5)
            ]
    return out


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    P = summary["permutations"]
    for part, c in (("natural", "C0"), ("constructed", "C1")):
        rm = summary[part]["sampled_rmse"]
        mean = [r["mean"] for r in rm]
        axes[0].errorbar(
            P,
            mean,
            yerr=[[m - r["lo"] for m, r in zip(mean, rm)], [r["hi"] - m for m, r in zip(mean, rm)]],
            color=c,
            marker="o",
            capsize=3,
            label=f"{part} team",
        )
    ref = summary["natural"]["sampled_rmse"][0]["mean"]
    axes[0].plot(P, [ref / np.sqrt(p) for p in P], "k:", label="1/sqrt(P) from P=1")
    axes[0].set(
        xscale="log",
        yscale="log",
        xlabel="antithetic permutation pairs P",
        ylabel="RMSE vs exact Shapley",
        title="sampled Shapley error (mean, 95% t over seeds)",
    )
    axes[0].legend(fontsize=8)
    ax = axes[1]
    cm = summary["constructed"]["credit_mean/exact"]
    names = ["planner", "a", "a' (dup)", "b", "null"]
    mean = [r["mean"] for r in cm]
    ax.bar(range(5), mean, color=["C0", "C1", "C1", "C2", "C7"])
    ax.errorbar(
        range(5),
        mean,
        yerr=[[m - r["lo"] for m, r in zip(mean, cm)], [r["hi"] - m for m, r in zip(mean, cm)]],
        fmt="none",
        color="k",
        capsize=3,
    )
    ax.set_xticks(range(5), names)
    ax.set(ylabel="mean exact Shapley credit", title="constructed team: credit per player")
    C.save_figure(fig, path)


def main(argv=None) -> None:
    ap = C.arguments(__doc__, steps=0, batch_help="problems per seed (G = 4 episodes each)")
    ap.set_defaults(batch=8)
    ap.add_argument("--draws", type=int, default=8, help="independent keys per permutation count")
    args = ap.parse_args(argv)
    C.quiet()
    per_seed = []
    for seed in args.seeds:
        done = args.root / "sharp_axioms" / f"tables_seed{seed}_b{args.batch}.json"
        if args.summarise and not done.exists():
            continue
        t = C.cached_run(done, tables, seed, args.root, args.batch)
        row = {"seed": seed, "seconds": t["seconds"]}
        for part, fn in (("natural", axioms), ("constructed", constructed_axioms)):
            tab = np.asarray(t[part], np.float32)
            row[part] = fn(tab, credits(tab, seed, args.draws))
        per_seed.append(row)
        print(
            f"seed {seed}: {len(t['natural'])} episodes, rollout + sandbox {t['seconds']:.0f} s", flush=True
        )
    summary = summarise(per_seed)
    settings = {"batch": args.batch, "G": G, "draws": args.draws, "workers": list(WORKERS), "sft": C.SFT}
    C.write_json(
        args.out / "sharp_axioms.json", {"settings": settings, "summary": summary, "per_seed": per_seed}
    )
    plot(summary, args.out / "sharp_axioms.png")
    for part in ("natural", "constructed"):
        s = summary[part]
        print(
            f"{part}: {s['episodes']} episodes ({s['episodes_varying']} with varying values); efficiency gap max "
            f"exact {s['efficiency_gap_max/exact']:.2e}, sampled {s['efficiency_gap_max/sampled']:.2e}, "
            f"counterfactual {s['efficiency_gap_max/counterfactual']:.3f} "
            f"(mean {s['efficiency_gap_mean/counterfactual']:.3f})"
        )
        print(
            "  sampled RMSE per P:",
            ", ".join(f"{p}: {r['mean']:.4f}" for p, r in zip(PERMUTATIONS, s["sampled_rmse"])),
        )
    s = summary["constructed"]
    print(
        f"constructed: symmetry gap max exact {s['symmetry_gap_max/exact']:.2e}, counterfactual "
        f"{s['symmetry_gap_max/counterfactual']:.2e}; null |phi| max exact {s['null_abs_max/exact']:.2e}, "
        f"sampled {s['null_abs_max/sampled']:.2e}, counterfactual {s['null_abs_max/counterfactual']:.2e}; "
        f"asymmetric episodes {s['asymmetric_episodes']}, non-null episodes {s['non_null_episodes']}"
    )


if __name__ == "__main__":
    main()
