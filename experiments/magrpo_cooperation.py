"""MAGRPO cooperation at toy scale: jointly trained agents against agents trained alone and untrained.

    PYTHONPATH=. python experiments/magrpo_cooperation.py --seeds 0 1 2 [--steps 40 --batch 4 --n-eval 32 --lr 1e-3]

MAGRPO (arXiv 2508.04652) trains agents that act together on a joint reward and
claims they cooperate better than agents trained alone or not at all. Here a
helper and a main agent write one program together (`workflow.magrpo`, task
`coop_code`: the helper writes `aux`, the main agent the entry point, which
should call it; level reward = structure + syntax + tests + cooperation), each
agent on its own policy, both loaded from the warm start of
`experiments/_common.py`, each prompted with the bare task (`TaskPromptCoop` says why; the judge
is the workflow's). Four settings per seed, each from the same warm start:

* untrained: the warm start itself;
* helper alone: only the helper's policy is updated, the main agent's stays at
  the warm start (its samples are generated and scored as usual, then dropped
  instead of entering its buffer);
* main alone: the same with the roles swapped;
* joint: both policies are updated (MAGRPO).

Every trained setting runs the same number of steps on the same task stream
and seed, so all sample the same number of joint actions (equal sample
budgets; an agent trained alone gets the gradient of its own half of them).
Held-out score: one greedy joint answer per held-out task (tasks disjoint
from training), the mean level reward, pass@1, and the share of answers earning
the cooperation level (the main agent uses a helper-defined `aux` and a test passes).

Writes docs/fidelity/magrpo_cooperation.json and .png.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

from marljax.envs import coop_code  # noqa: E402
from marljax.envs.joint import CoopCodeTask  # noqa: E402
from marljax.train.config import config_from_dict  # noqa: E402
from marljax.train.loop import Trainer  # noqa: E402

SETTINGS = {
    "untrained": (),
    "helper_alone": ("helper",),
    "main_alone": ("main",),
    "joint": ("helper", "main"),
}
METRICS = ("reward", "pass", "cooperation", "tests", "structure")
G = 4
LR = 1e-3  # the other fidelity experiments' RL learning rate


def config(seed: int, setting: str, steps: int, root: Path, n_eval: int, batch: int, lr: float = LR):
    """Two agents on two policies from one warm start, one turn, `coop_code`'s level reward."""
    template = "{role}{problem}{history}{feedback}"
    policy = {
        "model": {"path": str(C.warm_start(root=root))},
        "chat": "off",
        "optimizer": {"lr": lr},
        "loss": {"agg_mode": "seq-mean-token-mean"},
        "buffer": {"threshold": batch * G},  # one update per step per trained policy
        "micro_batch_size": 16,
    }
    return config_from_dict(
        {
            "name": f"magrpo_{setting}_seed{seed}",
            "run_dir": str(root / "magrpo" / f"{setting}_seed{seed}_lr{lr:g}"),
            "seed": seed,
            "policies": {"helper": policy, "main": policy},
            # two prompts the warm start answers with a program ("Solve. " and "Coder. " were taught the
            # same teacher's programs), so the agents differ by prompt and by policy
            "agents": {
                "helper": {"policy": "helper", "role": "Solve. ", "template": template},
                "main": {"policy": "main", "role": "Coder. ", "template": template},
            },
            "data": {
                "source": {
                    "kind": "synthetic",
                    "n_train": max(steps, 1) * batch,
                    "n_eval": n_eval,
                    "difficulty": 1,
                    "style": "steps",
                    "seed": seed,
                },
                "batch_size": batch,
            },
            "sampler": {"max_new_tokens": 40, "temperature": 1.0, "min_prompt_bucket": 64},
            "workflow": {
                "kind": "magrpo",
                "agents": ["helper", "main"],
                "group_size": G,
                "joint": "aligned",
                "num_turns": 1,
                "task": "coop_code",
            },
            "train": {
                "steps": steps,
                "save_every": max(steps, 1),
                "keep_checkpoints": 1,
                "log_to": [],
                "progress": False,
            },
        },
        source=f"<experiment magrpo {setting} seed {seed}>",
    )


class TaskPromptCoop(CoopCodeTask):
    """`coop_code` judged as the workflow judges it, but each agent's prompt is the bare task.

    `coop_code`'s prompts append the helper's / main agent's instructions to the task; after them the
    warm start (taught to answer "<role>. <task>" with a program) wrote code that compiled and passed
    no test on 16 held-out tasks (reward 0.1 = the syntax level alone, measured in a 2-step trial run),
    so no test or cooperation level could be earned. With the bare task both agents write a program
    for the task (the helper's first, the main agent's entry point last and winning), tests pass at the
    warm start's rate, and the structure and cooperation levels (a helper-defined `aux` that the
    entry point uses) stay open to learning from the joint reward alone: nothing tells the agents
    about `aux`, so the cooperation level can only be found by sampling.
    """

    def problem_text(self, problem, agent_index: int) -> str:
        return problem.prompt


def held_out(trainer: Trainer) -> dict[str, float]:
    """Greedy joint answers to the held-out tasks, scored level by level (module doc)."""
    wf, problems = trainer.workflow, trainer.eval_problems
    team = [trainer.agents[a] for a in wf.cfg.agents]
    tree = wf.grow(problems, team, trainer.eval_generator, trainer.verifier, 0, 1)
    answers = [[j.node.gens[k][c].text for k, c in enumerate(j.combo)] for j in tree.joints]
    scores = coop_code.score_pairs(
        problems, [a[0] for a in answers], [a[1] for a in answers], trainer.verifier
    )
    out = {
        "reward": float(np.mean([s.reward for s in scores])),
        "pass": float(np.mean([s.passed for s in scores])),
    }
    for level in ("cooperation", "tests", "structure"):
        out[level] = float(np.mean([s.levels[level] > 0 for s in scores]))
    return out


def run_one(seed: int, setting: str, steps: int, root: Path, n_eval: int, batch: int, lr: float = LR) -> dict:
    cfg = config(seed, setting, steps, root, n_eval, batch, lr)
    shutil.rmtree(cfg.run_dir, ignore_errors=True)  # an interrupted attempt: start afresh, not resume
    trainer = Trainer(cfg)
    trainer.workflow.task = TaskPromptCoop()  # replaces the cached `task` (see TaskPromptCoop)
    t0 = time.time()
    try:
        for name in ("helper", "main"):
            if name not in SETTINGS[setting]:
                # frozen: this policy's samples never reach its buffer, so it never updates
                trainer.buffers[name].add = lambda samples: None
        curves = []
        for _ in range(0 if setting == "untrained" else steps):
            m = trainer.train_step()
            curves.append(
                {
                    "step": trainer.step,
                    "team/reward": m.get("team/reward"),
                    "team/pass_rate": m.get("team/pass_rate"),
                }
            )
            curves[-1].update({k: m[k] for k in ("policy/helper/updates", "policy/main/updates") if k in m})
        after = held_out(trainer)
    finally:
        trainer.close()
    return {"seed": seed, "setting": setting, "after": after, "curves": curves, "seconds": time.time() - t0}


def summarise(runs: list[dict]) -> dict:
    """Per setting: each held-out metric's mean and 95% t interval over seeds; per trained setting,
    the paired difference joint - setting (same seed, same tasks)."""
    out: dict = {}
    by = {s: {r["seed"]: r for r in runs if r["setting"] == s} for s in SETTINGS}
    for s, mine in by.items():
        if mine:
            out[s] = {m: C.interval([r["after"][m] for r in mine.values()]) for m in METRICS}
            out[s]["per_seed_reward"] = [mine[k]["after"]["reward"] for k in sorted(mine)]
            curves = [[c["team/reward"] for c in r["curves"]] for r in mine.values() if r["curves"]]
            if curves:  # training reward (T = 1 samples): the first and the last quarter of the steps
                q = max(1, len(curves[0]) // 4)
                out[s]["train_reward_first"] = C.interval([float(np.mean(c[:q])) for c in curves])
                out[s]["train_reward_last"] = C.interval([float(np.mean(c[-q:])) for c in curves])
    for s in ("untrained", "helper_alone", "main_alone"):
        seeds = sorted(set(by["joint"]) & set(by[s]))
        if seeds:
            out[f"joint_minus_{s}"] = {
                m: C.interval([by["joint"][k]["after"][m] - by[s][k]["after"][m] for k in seeds])
                for m in METRICS
            }
    return out


def plot(runs: list[dict], summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, metric in zip(axes[:2], ("reward", "cooperation")):
        for c, s in enumerate(SETTINGS):
            if s not in summary:
                continue
            vals = [r["after"][metric] for r in runs if r["setting"] == s]
            iv = summary[s][metric]
            ax.scatter([c] * len(vals), vals, color=f"C{c}", alpha=0.6)
            ax.errorbar(
                [c],
                [iv["mean"]],
                yerr=[[iv["mean"] - iv["lo"]], [iv["hi"] - iv["mean"]]],
                color="k",
                capsize=4,
            )
        ax.set_xticks(range(len(SETTINGS)), list(SETTINGS), fontsize=8)
        ax.set(ylabel=f"held-out {metric}", title=f"held-out {metric} (seeds, mean, 95% t)")
    ax = axes[2]
    for c, s in enumerate(SETTINGS):
        mine = [r for r in runs if r["setting"] == s and r["curves"]]
        if not mine:
            continue
        steps = [cv["step"] for cv in mine[0]["curves"]]
        ys = np.array([[cv["team/reward"] for cv in r["curves"]] for r in mine])
        ax.plot(steps, ys.mean(0), color=f"C{c}", label=s)
        ax.fill_between(steps, ys.min(0), ys.max(0), color=f"C{c}", alpha=0.15)
    ax.set(xlabel="step", ylabel="training team reward", title="rollout reward (mean, min-max over seeds)")
    ax.legend(fontsize=8)
    C.save_figure(fig, path)


def main(argv=None) -> None:
    ap = C.arguments(__doc__, steps=40, batch_help="problems per step (G = 4 joint actions each)")
    ap.set_defaults(batch=4)
    ap.add_argument("--n-eval", type=int, default=32)
    ap.add_argument("--lr", type=float, default=LR, help="RL learning rate of both policies")
    args = ap.parse_args(argv)
    C.quiet()
    runs = []
    tag = f"s{args.steps}_e{args.n_eval}_b{args.batch}" + (f"_lr{args.lr:g}" if args.lr != LR else "")
    name = "magrpo_cooperation" + (f"_lr{args.lr:g}" if args.lr != LR else "")
    for seed in args.seeds:
        for s in SETTINGS:
            done = args.root / "magrpo" / f"{s}_seed{seed}_{tag}.json"
            if args.summarise and not done.exists():
                continue
            runs.append(
                C.cached_run(done, run_one, seed, s, args.steps, args.root, args.n_eval, args.batch, args.lr)
            )
            print(f"seed {seed} {s}: {runs[-1]['seconds']:.0f} s, {runs[-1]['after']}", flush=True)
    summary = summarise(runs)
    settings = {
        "seeds": sorted({r["seed"] for r in runs}),
        "steps": args.steps,
        "n_eval": args.n_eval,
        "batch": args.batch,
        "G": G,
        "num_turns": 1,
        "lr": args.lr,
        "sft": C.SFT,
    }
    C.write_json(args.out / f"{name}.json", {"settings": settings, "summary": summary, "runs": runs})
    plot(runs, summary, args.out / f"{name}.png")
    for s in SETTINGS:
        if s in summary:
            r = summary[s]["reward"]
            print(
                f"{s}: held-out reward {r['mean']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}], "
                f"pass {summary[s]['pass']['mean']:.3f}, cooperation {summary[s]['cooperation']['mean']:.3f}"
            )
    for s in ("untrained", "helper_alone", "main_alone"):
        d = summary.get(f"joint_minus_{s}")
        if d:
            print(
                f"joint - {s}: reward {d['reward']['mean']:+.3f} [{d['reward']['lo']:+.3f}, {d['reward']['hi']:+.3f}]"
            )


if __name__ == "__main__":
    main()
