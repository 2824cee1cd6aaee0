"""The tool workflows' team reward under RL after the sloppy teacher's warm start, per seed.

    python benchmarks/bench_tool_rise.py dr_mas_search --seeds 0 1 2 --slips 0.3 \
        --set workflow.process_weight=0.5

Prints each run's team reward per RL step, the tools' valid-call share at the end, and the rise (mean
of the last `--window` steps minus the mean of the first ones); the spread across seeds is what a
rise test's margin must exceed. `--evaluate N` also prints the team reward on N problems played
before and after RL (`warm_started_run`'s `evaluate`): fresh ones of the training world, or with
`--evaluate-on train` the training split in turn (the grid team's 8 grids).
`--set key=value` changes the run config (dotted key, YAML value);
the other settings are `marljax.demo.tools.warm_started_run`'s defaults.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

from marljax.demo.tools import warm_started_run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=["dr_mas_search", "sharp_tools", "at_grpo_tools"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--rl-steps", type=int, default=20)
    ap.add_argument("--slips", type=float, default=0.5)
    ap.add_argument("--kl-coef", type=float, default=0.1, help="KL penalty to the warm start (0: none)")
    ap.add_argument("--window", type=int, default=4)
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE")
    ap.add_argument(
        "--evaluate",
        type=int,
        default=0,
        help="problems played before and after RL",
    )
    ap.add_argument("--evaluate-on", choices=["fresh", "train"], default="fresh")
    args = ap.parse_args()
    changes = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.set)}
    rises, gains = [], []
    for seed in args.seeds:
        t = time.time()
        with tempfile.TemporaryDirectory() as out:
            records = warm_started_run(
                args.kind,
                Path(out),
                seed=seed,
                slips=args.slips,
                rl_steps=args.rl_steps,
                kl_coef=args.kl_coef,
                changes=changes,
                evaluate=args.evaluate,
                evaluate_on=args.evaluate_on,
            )
            path = Path(out, "evaluation.json")
            evaluation = json.loads(path.read_text()) if args.evaluate else None
        reward = np.array([r["team/reward"] for r in records])
        rise = reward[-args.window :].mean() - reward[: args.window].mean()
        rises.append(rise)
        if evaluation:
            gains.append(evaluation["after"] - evaluation["before"])
        valid = [
            r.get("tools/valid_call_frac", r.get("tools/process_reward")) for r in records[-args.window :]
        ]
        row = {
            "seed": seed,
            "rise": round(rise, 3),
            "valid_calls_last": round(float(np.mean(valid)), 2),
            "s": round(time.time() - t),
            "reward": reward.round(3).tolist(),
        }
        if evaluation:
            row["evaluation"] = {k: round(evaluation[k], 3) for k in ("before", "after")}
        print(json.dumps(row), flush=True)
    summary = {"kind": args.kind, "mean_rise": float(np.mean(rises)), "std_rise": float(np.std(rises))}
    if gains:  # the evaluated team reward after RL minus before
        summary.update(mean_gain=float(np.mean(gains)), std_gain=float(np.std(gains)))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
