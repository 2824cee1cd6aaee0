"""The embedded demo: a heterogeneous two-agent MARS2 team learns to write code, on a laptop CPU.

    python -m marljax.demo [--out DIR] [--quick] [--seed N]

1. Creates two tiny random models of different families and sizes (a Qwen3
   and a Llama) and their tokenizer as Hugging Face checkpoints.
2. Warm-starts each by SFT on its own sloppy teacher's solutions of
   synthetic "steps" tasks ("take the larger of x and 5"): each teacher makes
   a classic slip (`min` for `max`, `/` for `//`, ...) in three quarters of
   the lines of its own four operation kinds, disjoint from the other
   teacher's, so the two models learn different errors.
3. Trains, at equal sample budgets, single-agent GRPO, a homogeneous MARS2
   team (two agents on one policy) and a heterogeneous MARS2 team (one agent
   per model), each through `marljax.train.loop.Trainer`, rewarded by the
   sandbox: only the tests say which habit is right.
4. Before and after RL, on held-out tasks: each team's solve rate under
   MARS2-T+ test-time search (the headline; GRPO's one agent searches alone)
   and each policy's pass@1. Writes `results.md`, `results.json` and PNG
   figures to the output directory.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import time
from pathlib import Path

# Before transformers is first imported: the demo needs no torch, so its "PyTorch was not found" advice is noise.
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

from marljax.demo.models import ensure_models  # noqa: E402
from marljax.demo.pipeline import METHODS, DemoConfig, train_method, warm_start  # noqa: E402
from marljax.demo.report import results_table, write_plots  # noqa: E402
from marljax.rewards import SandboxPool  # noqa: E402

QUICK = dict(
    sft_steps=16,
    rl_steps=1,
    n_train=32,
    n_eval=8,
    problems_per_step=2,
    samples_per_problem=4,
    refine_examples=8,
)


def quiet() -> None:
    for name in ("absl", "orbax", "jax._src.xla_bridge"):
        logging.getLogger(name).setLevel(logging.ERROR)
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def same_settings(out: Path, settings: DemoConfig) -> bool:
    """Record `settings` in a new output directory; False when `out` was made with other ones."""
    path = out / "settings.json"
    mine = dataclasses.asdict(settings)
    if path.exists():
        return json.loads(path.read_text()) == mine
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(mine, indent=1))
    return True


def main(argv=None) -> int:
    if argv is None:  # from the command line: restart with host memory kept (see marljax.host_memory)
        from marljax.host_memory import restart_with_kept_memory

        restart_with_kept_memory(["-m", "marljax.demo", *sys.argv[1:]])
    parser = argparse.ArgumentParser(prog="python -m marljax.demo", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        help="output directory, reused on rerun (default: runs/demo, runs/demo-quick with --quick)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="a few steps of each stage (a smoke run, no learning)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    settings = DemoConfig(seed=args.seed, **(QUICK if args.quick else {}))
    args.out = args.out or Path("runs/demo-quick" if args.quick else "runs/demo")
    if not same_settings(args.out, settings):
        parser.error(
            f"{args.out} holds a run with other settings ({args.out / 'settings.json'}): a rerun reuses "
            "its models and checkpoints, so give another --out or delete that directory"
        )
    quiet()
    from marljax import backends
    from marljax.train import distributed

    distributed.initialize()  # as each Trainer would, with the defaults: before any backend starts
    backends.start()  # without libtpu's start-up noise
    start = time.perf_counter()
    print(f"marljax demo -> {args.out}", flush=True)
    with SandboxPool(max_workers=2) as pool:
        models = ensure_models(args.out / "models", pool, seed=args.seed)
    print("1/3 models: " + ", ".join(f"{k} at {v}" for k, v in models.items()), flush=True)
    sft_models = warm_start(args.out, models, settings)
    print("2/3 SFT warm start done", flush=True)
    warm: dict[str, list[float]] = {}  # per-task pass@1 of the warm-started models
    results = [train_method(args.out, method, sft_models, settings, warm) for method in METHODS]
    minutes = (time.perf_counter() - start) / 60
    table = results_table(results, settings, minutes)
    print("3/3 RL and evaluation done\n\n" + table, flush=True)
    (args.out / "results.md").write_text(table + "\n")
    (args.out / "results.json").write_text(
        json.dumps(
            {"settings": dataclasses.asdict(settings), "minutes": minutes, "results": results}, indent=1
        )
    )
    for png in write_plots(args.out, results, settings):
        print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
