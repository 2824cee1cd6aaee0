"""The tool workflows' team reward under RL after the sloppy teacher's warm start, per seed.

    python benchmarks/bench_tool_rise.py dr_mas_search --seeds 0 1 2 --rl-steps 16

Prints each run's team reward per RL step and the rise (mean of the last `--window` steps minus the
mean of the first ones); the spread across seeds sets the margin of tests/workflows/test_tool_rise.py.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from marljax.demo.tools import warm_started_run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=["dr_mas_search", "sharp_tools", "at_grpo_tools"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--rl-steps", type=int, default=16)
    ap.add_argument("--sft-steps", type=int, default=150)
    ap.add_argument("--window", type=int, default=4)
    args = ap.parse_args()
    rises = []
    for seed in args.seeds:
        t = time.time()
        with tempfile.TemporaryDirectory() as out:
            records = warm_started_run(
                args.kind, Path(out), seed=seed, sft_steps=args.sft_steps, sft_lr=1e-2, rl_steps=args.rl_steps
            )
        reward = np.array([r["team/reward"] for r in records])
        rise = reward[-args.window :].mean() - reward[: args.window].mean()
        rises.append(rise)
        row = {
            "seed": seed,
            "rise": round(rise, 3),
            "s": round(time.time() - t),
            "reward": reward.round(3).tolist(),
        }
        print(json.dumps(row), flush=True)
    print(
        json.dumps({"kind": args.kind, "mean_rise": float(np.mean(rises)), "std_rise": float(np.std(rises))})
    )


if __name__ == "__main__":
    main()
