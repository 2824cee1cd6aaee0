"""What the fidelity experiments share: a warm-started tiny team, run configs, statistics, plots.

A random tiny model writes no working program, so every reward is 0 and no
advantage or gradient exists to study. Each seed's model is therefore first
fine-tuned (SFT) on a teacher's answers for all four roles the experiments
use, on one shared policy with role prompts:

* solver / coder: the synthetic "steps" task's reference program, with the
  demo teacher's classic slips in half of the lines that admit one
  (`marljax.demo.teacher`), so about half the programs fail their tests;
* tester: ``assert`` lines from the task's test cases, each with a wrong
  expected value at `TEST_SLIPS`, so testers write both valid and invalid tests;
* verifier: the Dr. MAS review prompt of a (slipped) teacher program with its
  public-test feedback, answered ACCEPT when the program passes every test and
  REVISE otherwise.

The warm start is cached under ``ROOT/warm/seed<WARM_SEED>`` (a Hugging Face
directory) and reused by both experiments and every RL seed: on two shared
CPU cores one SFT per seed did not fit the time these experiments had, so the
seeds vary the RL sampling, the task order and the tasks, not the warm start.
RL then runs from it with the library's `Trainer`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

from marljax.demo.teacher import teacher_completion  # noqa: E402
from marljax.envs.code import TESTER_TASK  # noqa: E402
from marljax.rewards import extract_code, public_feedback  # noqa: E402
from marljax.train.config import config_from_dict  # noqa: E402
from marljax.train.loop import Trainer  # noqa: E402
from marljax.train.metrics import MetricsWriter  # noqa: E402
from marljax.train.sft import pair_samples  # noqa: E402
from marljax.workflows.dr_mas import Episode  # noqa: E402

ROOT = Path(os.environ.get("MARLJAX_EXPERIMENTS_DIR", "runs/fidelity"))
DOCS = Path(__file__).resolve().parent.parent / "docs" / "fidelity"
ROLES = {
    "solver": "Solve. ",
    "verifier": "Reply ACCEPT or REVISE. ",
    "coder": "Coder. ",
    "tester": "Tester: write asserts. ",
}
TEMPLATE = "{role}{problem}{feedback}"
CODE_SLIPS = 0.5  # the demo teacher's rate
TEST_SLIPS = 0.3
SFT = dict(steps=60, batch=16, lr=1e-2)
WARM_SEED = 0
SFT_SEED_OFFSET = 500_000  # SFT tasks; RL tasks from the seed itself, held-out ones from 1,000,000 on


def quiet() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for name in ("absl", "orbax", "jax._src.xla_bridge", "marljax.train.generation"):
        logging.getLogger(name).setLevel(logging.ERROR)


def run_config(
    name: str,
    run_dir: Path,
    seed: int,
    model: dict[str, Any],
    workflow: dict[str, Any],
    *,
    steps: int,
    lr: float,
    threshold: int,
    n_train: int,
    n_eval: int,
    batch_size: int,
    train: dict[str, Any] | None = None,
    sft: bool = False,
) -> Any:
    """A one-policy run (all four role agents on it) of `workflow`, in the tiny configs' style."""
    optimizer = (  # SFT: two optimiser steps per step (short and long prompts apart)
        {"lr": lr, "warmup_steps": 10, "schedule": "cosine", "decay_steps": 2 * steps, "min_lr_ratio": 0.1}
        if sft
        else {"lr": lr}
    )
    return config_from_dict(
        {
            "name": name,
            "run_dir": str(run_dir),
            "seed": seed,
            "policies": {
                "shared": {
                    "model": model,
                    "chat": "off",  # a random-init model taught raw text: no chat markup
                    "optimizer": optimizer,
                    "loss": {"agg_mode": "seq-mean-token-mean"},  # every sample weighs the same
                    "buffer": {"threshold": threshold},
                    "micro_batch_size": 16,
                }
            },
            "agents": {a: {"policy": "shared", "role": r, "template": TEMPLATE} for a, r in ROLES.items()},
            "data": {
                "source": {
                    "kind": "synthetic",
                    "n_train": n_train,
                    "n_eval": n_eval,
                    "difficulty": 1,
                    "style": "steps",
                    "seed": seed + SFT_SEED_OFFSET if sft else seed,
                },
                "batch_size": batch_size,
            },
            "sampler": {"max_new_tokens": 40, "temperature": 1.0, "min_prompt_bucket": 64},
            "workflow": workflow,
            "train": {
                "steps": steps,
                "save_every": steps,
                "keep_checkpoints": 1,
                "log_to": [],
                "progress": False,
                **(train or {}),
            },
        },
        source=f"<experiment {name}>",
    )


def teacher_tests(problem: Any, rng: random.Random, n: int = 4) -> str:
    """Up to `n` asserts from the task's cases; each expected value is off by one at `TEST_SLIPS`."""
    f = problem.fields
    lines = []
    for args, out in list(zip(f["inputs"], f["outputs"]))[:n]:
        if isinstance(out, int) and rng.random() < TEST_SLIPS:
            out += 1
        lines.append(f"assert {f['fn_name']}({', '.join(repr(a) for a in args)}) == {out!r}")
    return "```python\n" + "\n".join(lines) + "\n```"


def sft_pairs(trainer: Trainer, problems: list[Any], seed: int) -> dict[str, list[tuple[str, str]]]:
    """(prompt, target) pairs of each role for `problems` (see the module doc)."""
    agents = {a: trainer.agents[a] for a in ROLES}
    codes = [teacher_completion(p, CODE_SLIPS, seed) for p in problems]
    scores = trainer.verifier.score(problems, codes)
    review = trainer.workflow  # a Dr. MAS workflow: its verifier prompt, exactly as in training
    rng = random.Random(f"tests:{seed}")
    pairs: dict[str, list[tuple[str, str]]] = {a: [] for a in ROLES}
    for p, code, score in zip(problems, codes, scores):
        pairs["solver"].append((agents["solver"].render_in_context(p.prompt), code))
        pairs["coder"].append((agents["coder"].render_in_context(p.prompt), code))
        pairs["tester"].append(
            (agents["tester"].render_in_context(p.prompt + TESTER_TASK), teacher_tests(p, rng))
        )
        ep = Episode(p, 0, code=extract_code(code).code, score=score, feedback=public_feedback(score.result))
        ep.used["solver"] = 1
        verdict = "ACCEPT" if score.passed else "REVISE: the program fails a test."
        pairs["verifier"].append((review._prompt("verifier", ep, agents["verifier"]), verdict))
    return pairs


def warm_start(seed: int = WARM_SEED, root: Path = ROOT) -> Path:
    """The warm-started model directory (made on first use; see the module doc)."""
    dest = root / "warm" / f"seed{seed}"
    if (dest / "config.json").exists():
        return dest
    steps, batch = SFT["steps"], SFT["batch"]
    cfg = run_config(
        f"sft_seed{seed}",
        root / "warm" / f"sft_seed{seed}",
        seed,
        {"preset": "tiny-qwen3", "seed": seed},
        {"kind": "dr_mas", "solver": "solver", "verifier": "verifier"},
        steps=steps,
        lr=SFT["lr"],
        threshold=1,
        n_train=steps * batch,
        n_eval=1,
        batch_size=batch,
        sft=True,
    )
    trainer = Trainer(cfg)
    try:
        policy = trainer.policies["shared"]
        pairs = sft_pairs(trainer, trainer.train_problems, seed)
        passed = np.mean([t == "ACCEPT" for _, t in pairs["verifier"]])
        logging.warning(
            "seed %d: SFT on %d tasks, %.0f%% of teacher programs pass", seed, steps * batch, 100 * passed
        )
        trainer.run_dir.mkdir(parents=True, exist_ok=True)
        with MetricsWriter(trainer.run_dir, log_to=()) as writer:
            for k in range(steps):
                # the long review prompts in a batch of their own: the short ones are not padded to them
                for part, roles in enumerate((("solver", "coder", "tester"), ("verifier",))):
                    samples = []
                    for role in roles:
                        rows = pairs[role][k * batch : (k + 1) * batch]
                        samples += pair_samples(rows, trainer.agents[role], policy)
                    metrics = policy.sft_update(samples)
                    writer.write(2 * k + part, {f"sft/{key}": v for key, v in metrics.items()})
        policy.export(dest)
    finally:
        trainer.close()
    return dest


def interval(values: list[float]) -> dict[str, float]:
    """Mean, sample std and a 95% t interval of the mean (n - 1 degrees of freedom)."""
    from scipy import stats

    x = np.asarray(values, np.float64)
    n = len(x)
    mean = float(x.mean())
    if n < 2:
        return {"mean": mean, "std": 0.0, "lo": mean, "hi": mean, "n": n}
    std = float(x.std(ddof=1))
    half = float(stats.t.ppf(0.975, n - 1) * std / np.sqrt(n))
    return {"mean": mean, "std": std, "lo": mean - half, "hi": mean + half, "n": n}


def read_metrics(run_dir: Path) -> list[dict[str, float]]:
    """The RL steps' records of a run's metrics.jsonl (SFT steps are negative)."""
    path = Path(run_dir) / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("step", 0) > 0]


def cached_run(path: Path, run: Any, *args: Any) -> dict:
    """`run(*args)`'s result dict, saved at `path` once it finishes; a later invocation loads it instead of
    running again (so an interrupted experiment resumes, and `--summarise` works on finished runs)."""
    if path.exists():
        return json.loads(path.read_text())
    result = run(*args)
    write_json(path, result)
    return result


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def arguments(doc: str, steps: int, batch_help: str) -> argparse.ArgumentParser:
    """The options every experiment takes; an experiment adds its own."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--batch", type=int, default=2, help=batch_help)
    ap.add_argument("--root", type=Path, default=ROOT, help="run directories and warm starts")
    ap.add_argument("--summarise", action="store_true", help="only the runs already finished, no training")
    ap.add_argument("--out", type=Path, default=DOCS)
    return ap


def save_figure(fig: Any, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
