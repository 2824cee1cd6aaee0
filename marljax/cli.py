"""Command line.

marljax train CONFIG [key=value ...]         train (resumes RUN_DIR's newest checkpoint)
marljax eval CONFIG [--search] [key=value ...]  held-out evaluation of the newest checkpoint
marljax export RUN_DIR --policy NAME [--step N] OUT_DIR  a policy's weights as an HF directory (adapters: PEFT)
marljax plot RUN_DIR                         metric curves to RUN_DIR/plots/*.png
marljax rollouts RUN_DIR [--step N] [--agent A] [--limit K]  a logged step's samples (train.log_rollouts)
marljax compile CONFIG --topology v5p:4x4x4 [key=value ...]  compile each policy's programs ahead of time
                                             and report their memory per device (see marljax.train.aot)
marljax demo [...]                           the embedded demonstration
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path


def _trainer(config: str, overrides: list[str], search: bool = False):
    from marljax.train.config import ConfigError, load_config

    cfg = load_config(config, overrides)
    if search:
        # a workflow with test-time search at evaluation names its switch `eval_search`
        if "eval_search" not in type(cfg.workflow).model_fields:
            raise ConfigError(
                [f"{config}: workflow: --search: {cfg.workflow.kind!r} has no test-time search"]
            )
        cfg = load_config(config, [*overrides, "workflow.eval_search=true"])
    return _start_trainer(cfg)


def _start_trainer(cfg):
    from marljax import backends
    from marljax.train import distributed
    from marljax.train.loop import Trainer

    distributed.initialize(cfg.distributed)  # a multi-process run joins before any backend starts
    backends.start()  # here rather than in the Trainer: without libtpu's start-up noise
    return Trainer(cfg)


def cmd_train(args) -> int:
    trainer = _trainer(args.config, args.overrides)
    try:
        trainer.run()
    except KeyboardInterrupt:
        trainer.close()  # lets a checkpoint being written finish, so the rerun can resume from it
        print("\n".join(train_summary(trainer, args.config, args.overrides, interrupted=True)), flush=True)
        return 130
    print("\n".join(train_summary(trainer, args.config, args.overrides)))
    return 0


SINK_NAMES = {"tensorboard": "TensorBoard", "wandb": "wandb"}


def train_summary(trainer, config: str, overrides: list[str], interrupted: bool = False) -> list[str]:
    """Where a `train` run keeps its checkpoints, metrics and rollouts, and the commands that read
    them: printed when it ends or is interrupted, since the layout is otherwise only in the README."""
    import shlex

    from marljax.train import rollout_log

    run, t = trainer.run_dir, trainer.cfg.train
    saved = trainer.checkpointer.latest_step()
    logged = rollout_log.logged_steps(run)
    same = [config, *overrides]
    if interrupted:
        resume = (
            f"rerun `{shlex.join(['marljax', 'train', *same])}` to resume from step {saved}"
            if saved is not None
            else f"no checkpoint yet (one every {t.save_every} steps): a rerun starts afresh"
        )
        head = f"interrupted at step {trainer.step} of {t.steps}: {resume}"
    else:
        head = f"{trainer.cfg.name}: step {trainer.step} of {t.steps}"
    lines = [
        head,
        f"  run directory  {run}/ (config.yaml: the settings it started with)",
        f"  checkpoints    {run}/checkpoints/ " + ("(none)" if saved is None else f"(newest: step {saved})"),
        f"  metrics        {run}/metrics.jsonl"
        + "".join(f", {SINK_NAMES[sink]}: {run}/{sink}/" for sink in t.log_to),
        f"  plots          {run}/plots/*.png, drawn by `marljax plot {run}`",
        f"  rollouts       {run}/rollouts/ (steps {_ranges(logged)})"
        if logged
        else "  rollouts       none logged (train.log_rollouts=N logs every N-th step)",
        "next:",
        f"  {shlex.join(['marljax', 'eval', *same])}",
        f"  marljax plot {run}",
    ]
    if logged:
        lines.append(f"  marljax rollouts {run} --limit 8")
    if "wandb" in t.log_to and (t.wandb.mode or os.environ.get("WANDB_MODE")) == "offline":
        lines.append(f"  wandb sync {run}/wandb/offline-run-*   (uploads the offline wandb run)")
    if saved is not None:
        lines.append(f"  marljax export {run} --policy {sorted(trainer.policies)[0]} OUT_DIR")
    return lines


def cmd_eval(args) -> int:
    from marljax.train.metrics import task_progress

    trainer = _trainer(args.config, args.overrides, search=args.search)
    try:
        restored = trainer.restore()
        n = len(trainer.eval_problems)
        with task_progress(f"evaluating step {trainer.step}", n) as advance:
            metrics = trainer.evaluate()
            advance(n)
    finally:
        trainer.close()
    print(json.dumps({"step": trainer.step if restored else 0, **metrics}, indent=1, sort_keys=True))
    return 0


def cmd_export(args) -> int:
    from marljax.train.config import load_config

    run_dir = Path(args.run_dir)
    config = run_dir / "config.yaml"
    if not config.is_file():
        raise SystemExit(f"{config}: not found (is {run_dir} a marljax run directory?)")
    cfg = load_config(config, [f"run_dir={run_dir}"])
    if args.policy not in cfg.policies:
        raise SystemExit(f"{config}: no policy {args.policy!r}; policies: {sorted(cfg.policies)}")
    trainer = _start_trainer(cfg)
    try:
        try:
            restored = trainer.restore(args.step)
        except (FileNotFoundError, RuntimeError) as e:
            raise SystemExit(f"{run_dir}: step {args.step}: {e}") from None
        if not restored:
            raise SystemExit(f"{run_dir}: no complete checkpoint to export")
        out = trainer.policies[args.policy].export(args.out_dir, merged=args.merged)
    finally:
        trainer.close()
    print(f"exported policy {args.policy!r} at step {trainer.step} to {out}")
    return 0


def cmd_plot(args) -> int:
    from marljax.train.plot import plot_run

    for path in plot_run(args.run_dir):
        print(path)
    return 0


def cmd_check_data(args) -> int:
    """Run every row's reference answer against its own tests: a row whose reference fails would
    teach SFT a wrong answer and make RL's reward unreachable."""
    from marljax.rewards import SandboxPool
    from marljax.rewards.verifier import score_texts
    from marljax.tasks.files import load_problems
    from marljax.train.sft import reference_completion

    problems = load_problems(args.file, args.schema)
    references = [(p, reference_completion(p)) for p in problems]
    checked = [(p, ref) for p, ref in references if ref is not None]
    with SandboxPool() as pool:
        scores = score_texts([p for p, _ in checked], [ref for _, ref in checked], pool)
    failing = 0
    for (problem, _), score in zip(checked, scores):
        if score.passed:
            continue
        failing += 1
        print(
            f"{problem.source}: {problem.id}: the reference passes {score.reward:.0%} of the tests{_why(score)}"
        )
    missing = len(problems) - len(checked)
    print(
        f"{args.file}: {len(checked) - failing} of {len(checked)} reference answers pass all their tests"
        + (f"; {missing} rows have no reference answer" if missing else "")
    )
    return 1 if failing else 0


def _why(score) -> str:
    """The first failing test of a sandbox result, in a few words."""
    result = score.result
    if result is None:  # a math answer
        return ""
    failed = next((t for t in result.tests if t.status != "passed"), None)
    if failed is None:  # the program itself failed (a syntax error, a timeout) before any test
        return f" ({result.status}: {result.error_type or ''} {result.error_message or ''}".rstrip() + ")"
    detail = failed.message or (
        f"expected {failed.expected!r}, got {failed.actual!r}" if failed.expected else ""
    )
    return f" (test {failed.index}: {failed.status}{': ' + detail[:160] if detail else ''})"


def cmd_rollouts(args) -> int:
    from marljax.train import rollout_log

    if args.limit is not None and args.limit < 1:
        raise SystemExit(f"--limit must be at least 1, got {args.limit}")
    steps = rollout_log.logged_steps(args.run_dir)
    if not steps:
        raise SystemExit(f"{args.run_dir}: no rollout logs (train with train.log_rollouts=N)")
    step = steps[-1] if args.step is None else args.step
    if step not in steps:
        raise SystemExit(f"{args.run_dir}: step {step} was not logged; logged steps: {_ranges(steps)}")
    for line in rollout_log.format_step(
        rollout_log.read_step(args.run_dir, step), agent=args.agent, limit=args.limit
    ):
        print(line)
    return 0


COMPILE_HELP = (
    "Compiles each policy's update step and its sampler's prefill and decode programs ahead of time "
    "for a TPU topology (libtpu, no TPU needed) or N fake CPU devices, and prints per policy and "
    "program the per-device arguments, outputs, temporaries, FLOPs and collectives beside the memory "
    "estimate and the chip's memory. A program does not fit when arguments + outputs - donated buffers "
    "+ temporaries + the policy's resident state it does not take exceed the chip's memory; the exit "
    "status is then 1, naming the policy and the program."
)


def cmd_compile(args) -> int:
    if args.devices is not None:
        if args.devices < 1:
            raise SystemExit(f"--devices must be at least 1, got {args.devices}")
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        import jax

        try:
            jax.config.update("jax_num_cpu_devices", args.devices)
        except RuntimeError as e:
            raise SystemExit(f"--devices {args.devices}: {e}") from None
    if args.num_slices < 1:
        raise SystemExit(f"--num-slices must be at least 1, got {args.num_slices}")
    from marljax import backends
    from marljax.train import aot
    from marljax.train.config import load_config

    programs = [p.strip() for p in args.programs.split(",") if p.strip()]
    bad = [p for p in programs if p not in ("update", "prefill", "decode")]
    if bad or not programs:
        raise SystemExit(f"--programs {args.programs!r}: choose from update, prefill, decode")
    cfg = load_config(args.config, args.overrides)
    unknown = [p for p in args.policy or () if p not in cfg.policies]
    if unknown:
        raise SystemExit(f"--policy {unknown[0]!r}: not in {args.config}; policies: {sorted(cfg.policies)}")
    try:
        if args.topology is not None:
            # a topology's devices load libtpu without starting this machine's backends (a TPU here
            # may be another run's)
            with backends.quiet_libtpu():
                devices, tpu = aot.topology_devices(args.topology, args.num_slices), True
        else:
            import jax

            if args.num_slices != 1:
                raise aot.CompileError("--num-slices needs --topology")
            backends.start()
            devices = jax.devices("cpu") if args.devices is not None else jax.devices()
            tpu = devices[0].platform == "tpu"
        print(f"target: {aot.describe_target(devices)}", flush=True)
        reports = aot.compile_run(
            cfg,
            devices,
            seq_len=args.seq_len,
            micro_batches=args.micro_batches,
            programs=programs,
            tpu=tpu,
            policies=args.policy,
            dump_to=args.dump,
            out=lambda text: print(text, flush=True),
        )
    except aot.CompileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    failed = [r for r in reports if not r.fits]
    for r in failed:
        needs = (
            r.error
            or f"needs {aot.memory._bytes(r.peak)} per device, the device has {aot.memory._bytes(r.limit)}"
        )
        print(f"error: policy {r.policy!r} {r.program} does not fit: {needs}", file=sys.stderr)
    return 1 if failed else 0


def _ranges(steps: list[int]) -> str:
    """The logged steps, shortened for a long run: `10, 20, 30, ..., 990, 1000 (100 steps)`."""
    if len(steps) <= 8:
        return ", ".join(map(str, steps))
    return f"{', '.join(map(str, steps[:3]))}, ..., {', '.join(map(str, steps[-2:]))} ({len(steps)} steps)"


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # from the command line: restart with host memory kept (see marljax.host_memory)
        from marljax.host_memory import restart_with_kept_memory

        restart_with_kept_memory(["-m", "marljax.cli", *sys.argv[1:]])
        argv = sys.argv[1:]
        # modules a config names (`workflow.module`, `train.sft_teacher.script`) are found in the
        # current directory, as under `python -m marljax.cli` (the restart), with the restart off too
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
    parser = argparse.ArgumentParser(prog="marljax", description="JAX-native multi-agent RL for LLM teams")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="debug-level logs (e.g. the memory estimate's breakdown)"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for name, fn, what in (
        ("train", cmd_train, "train from a YAML config"),
        ("eval", cmd_eval, "evaluate the newest checkpoint on held-out problems"),
    ):
        p = commands.add_parser(name, help=what)
        p.add_argument("config", help="YAML file under configs/")
        p.add_argument("overrides", nargs="*", help="dotted.key=value, e.g. policies.main.optimizer.lr=1e-6")
        if name == "eval":
            p.add_argument(
                "--search",
                action="store_true",
                help="add the workflow's test-time search (mars2: MARS2-T+, tree search on public tests, "
                "sampled as in training; workflow.eval_search_sampling=eval samples it as eval_sampling)",
            )
        p.set_defaults(fn=fn)
    p = commands.add_parser("export", help="write a policy's weights as a Hugging Face directory")
    p.add_argument("run_dir")
    p.add_argument("--policy", required=True)
    p.add_argument("out_dir")
    p.add_argument(
        "--step",
        type=int,
        help="the checkpoint to export (default: the newest); step 0 of a run with an SFT warm start "
        "is that warm start",
    )
    p.add_argument(
        "--merged",
        action="store_true",
        help="adapter (lora) policies: the base with the adapter folded in, as a full checkpoint "
        "(default: a PEFT adapter directory)",
    )
    p.set_defaults(fn=cmd_export)
    p = commands.add_parser("plot", help="draw a run's curves to PNG")
    p.add_argument("run_dir")
    p.set_defaults(fn=cmd_plot)
    p = commands.add_parser("rollouts", help="print a logged step's prompts, completions and rewards")
    p.add_argument("run_dir")
    p.add_argument("--step", type=int, help="the step to show (default: the last one logged)")
    p.add_argument("--agent", help="only this agent's samples")
    p.add_argument("--limit", type=int, help="show at most this many samples")
    p.set_defaults(fn=cmd_rollouts)
    p = commands.add_parser(
        "check-data", help="run each row's reference answer against its tests (in the sandbox)"
    )
    p.add_argument("file", help="a JSONL file of problems")
    p.add_argument("--schema", default="auto", help="humaneval, mbpp, stdio, math or auto (default)")
    p.set_defaults(fn=cmd_check_data)
    p = commands.add_parser(
        "compile", help="compile a run's programs ahead of time for a topology", description=COMPILE_HELP
    )
    p.add_argument("config", help="YAML run config")
    p.add_argument("overrides", nargs="*", help="dotted.key=value, as for train")
    target = p.add_mutually_exclusive_group()
    target.add_argument("--topology", help="TPU topology to compile for, e.g. v5p:4x4x4 or v5e:4x4 (libtpu)")
    target.add_argument("--devices", type=int, help="compile for N fake CPU devices instead")
    p.add_argument("--num-slices", type=int, default=1, help="slices of --topology (multislice)")
    p.add_argument(
        "--seq-len", type=int, help="update tokens per row (default max_prompt_len + max_new_tokens)"
    )
    p.add_argument(
        "--micro-batches", type=int, help="micro-batches per update (default from buffer.threshold)"
    )
    p.add_argument("--programs", default="update,prefill,decode", help="comma-separated subset to compile")
    p.add_argument("--policy", action="append", help="only this policy (repeatable)")
    p.add_argument(
        "--dump", metavar="DIR", help="write XLA's dumps (HLO, buffer assignment) of each program to DIR"
    )
    p.set_defaults(fn=cmd_compile)
    commands.add_parser("demo", help="run the embedded demonstration", add_help=False)
    args, rest = parser.parse_known_args(argv)
    if args.command == "demo":
        from marljax.demo.__main__ import main as demo_main

        return demo_main(rest)
    if args.command in ("train", "eval", "compile"):  # overrides may also follow an option such as --search
        args.overrides += [r for r in rest if "=" in r and not r.startswith("-")]
        rest = [r for r in rest if r not in args.overrides]
    if rest:
        parser.error(f"unrecognised arguments: {' '.join(rest)}")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    # orbax is chatty at INFO, jax names every backend it could not start (no TPU here, ...)
    for chatty in ("absl", "jax"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
    from marljax.jsonl import DataError
    from marljax.models.hf_io import CheckpointError
    from marljax.train.config import ConfigError

    try:
        return args.fn(args)
    except ConfigError as e:  # one problem is one line; several get a count above them
        print(f"error: {e.problems[0] if len(e.problems) == 1 else e}", file=sys.stderr)
        return 2
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except CheckpointError as e:  # a model or tokenizer directory a config names (policy.load_model)
        config = getattr(args, "config", None) or Path(args.run_dir) / "config.yaml"
        print(f"error: {config}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
