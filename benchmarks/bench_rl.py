"""RL iteration breakdown: where the wall time of `marljax.train.loop.Trainer.run()` goes.

    python benchmarks/bench_rl.py [--mode full|quick|smoke] [--json PATH] [--demo-dir DIR]

Runs real configs (`configs/grpo_tiny.yaml`, `configs/mars2_tiny.yaml`, and the
embedded demo's three runs on its warm-started models, whose programs really
run in the sandbox) through `Trainer.run()` in a temporary run directory. Nothing in the library is
edited: the benchmark wraps, from the outside, the calls that do each kind of
work and times them (exclusive time: a timed call inside another timed call is
charged to the inner one only):

    compile       lowering to StableHLO and XLA compilation (jax.monitoring events),
                  wherever it happens (mostly inside sampling and update)
    sampling      SamplerView.generate (the jitted sampler)
    sandbox       SandboxPool.map (running and scoring the programs)
    advantages    the advantage kernels the workflows call
    update        Trainer.update_ready_policies (every policy update of the step: collate,
                  log-probs, loss, gradients, optax)
    metrics       amplification and diversity metrics of each step
    logging       MetricsWriter.write (JSONL + TensorBoard)
    checkpoint    Trainer.save (orbax, asynchronous: the write overlaps the next steps)
    other         everything else (workflow logic, tokenising, buffers, tree search)

The first `warmup` steps (which compile the sampler and the update) are left
out of the shares. `Trainer.close()` (waiting for the last checkpoint's write,
stopping the sandbox pool) happens once per run, however long: it is reported
on its own ("end of run"), not spread over the measured steps. Then MARS2's
cost is measured against nodes per tree (`max_nodes`) and team size (1, 2, 3
agents, one policy each).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import jax
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CATEGORIES = (
    "compile",
    "sampling",
    "sandbox",
    "advantages",
    "update",
    "metrics",
    "logging",
    "checkpoint",
    "other",
)
ADVANTAGE_KERNELS = (
    "grpo_advantages",
    "dr_grpo_advantages",
    "rloo_advantages",
    "mars2_advantages",
    "magrpo_advantages",
    "magrpo_node_advantages",
    "at_grpo_advantages",
    "dr_mas_advantages",
    "sharp_advantages",
)


class Clock:
    """Exclusive wall time per category and per training step."""

    def __init__(self):
        self.step = -1  # -1: building the Trainer, before the first step
        self.by_step: dict[int, dict[str, float]] = {}
        self._stack: list[list[float]] = []  # [start, time spent in nested timed calls]

    def wrap(self, category: str, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            self._stack.append([time.perf_counter(), 0.0])
            try:
                return fn(*args, **kwargs)
            finally:
                start, nested = self._stack.pop()
                spent = time.perf_counter() - start
                self.record(category, spent - nested)
                if self._stack:
                    self._stack[-1][1] += spent

        return timed

    def record(self, category: str, seconds: float, nested: bool = False):
        d = self.by_step.setdefault(self.step, {})
        d[category] = d.get(category, 0.0) + seconds
        if nested and self._stack:  # charged to `category`, not to the enclosing call
            self._stack[-1][1] += seconds


# lowering and XLA compilation; tracing is left to its caller's category (nested jits would count twice)
COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)
_CLOCK: list[Clock] = []


def _on_event(name: str, seconds: float, **_):
    if name in COMPILE_EVENTS and _CLOCK:
        _CLOCK[-1].record("compile", seconds, nested=True)


@contextlib.contextmanager
def instrumented(clock: Clock):
    """Patch the library's entry points (restored afterwards)."""
    from marljax import kernels
    from marljax.rewards.pool import SandboxPool
    from marljax.train import loop
    from marljax.train.metrics import MetricsWriter
    from marljax.train.sampling import SamplerView
    from marljax.workflows import grpo
    from marljax.workflows import types as workflow_types

    sandbox_map = SandboxPool.map

    def counted_map(self, programs, *args, **kwargs):  # also counts programs that really ran
        res = sandbox_map(self, programs, *args, **kwargs)
        c = clock.by_step.setdefault(clock.step, {})
        c["programs"] = c.get("programs", 0) + len(res)
        c["programs_run"] = c.get("programs_run", 0) + sum(
            r.status.value not in ("no_code", "syntax_error") for r in res
        )
        return res

    patches = [
        (SamplerView, "generate", "sampling"),
        (SandboxPool, "map", "sandbox"),
        (loop.Trainer, "update_ready_policies", "update"),
        (workflow_types, "agent_metrics", "metrics"),
        (workflow_types, "amplification_metrics", "metrics"),
        (loop, "diversity_of", "metrics"),
        (MetricsWriter, "write", "logging"),
        (loop.Trainer, "save", "checkpoint"),
    ]
    patches += [(kernels, name, "advantages") for name in ADVANTAGE_KERNELS]
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    saved_est = dict(grpo.ESTIMATORS)
    train_step = loop.Trainer.train_step

    def step_marker(self):
        clock.step = self.step  # everything until the next train_step belongs to this step
        return train_step(self)

    if not getattr(instrumented, "listening", False):
        jax.monitoring.register_event_duration_secs_listener(_on_event)
        instrumented.listening = True
    _CLOCK.append(clock)
    try:
        for obj, name, cat in patches:
            setattr(obj, name, clock.wrap(cat, getattr(obj, name)))
        SandboxPool.map = clock.wrap("sandbox", counted_map)
        for k, fn in saved_est.items():
            grpo.ESTIMATORS[k] = clock.wrap("advantages", fn)
        loop.Trainer.train_step = step_marker
        yield
    finally:
        for obj, name, fn in saved:
            setattr(obj, name, fn)
        grpo.ESTIMATORS.update(saved_est)
        loop.Trainer.train_step = train_step
        _CLOCK.remove(clock)


def run_config(data: dict, warmup: int, steps: int) -> dict:
    """Train `warmup + steps` steps of config `data`; see `measure`."""
    from marljax.train.config import config_from_dict

    data = copy.deepcopy(data)
    with tempfile.TemporaryDirectory(prefix="marljax-bench-rl-") as tmp:
        data["run_dir"] = tmp
        data.setdefault("train", {}).update(steps=warmup + steps, eval_every=None)
        return measure(config_from_dict(data, "<bench_rl>"), warmup, steps)


def measure(cfg, warmup: int, steps: int) -> dict:
    """Run `cfg` (a `RunConfig` of `warmup + steps` steps, fresh run_dir); per-category seconds
    summed over the measured steps."""
    from marljax.train.loop import Trainer

    if cfg.train.steps != warmup + steps:
        raise ValueError(f"config trains {cfg.train.steps} steps, not warmup + steps = {warmup + steps}")
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"progress": False})})
    jax.clear_caches()  # every run compiles from scratch, as a fresh process would
    clock = Clock()
    with instrumented(clock):
        trainer = Trainer(cfg)
        # wall time of each step: from its train_step to the next one (the last one: to close())
        starts: dict[int, float] = {}
        inner, close = trainer.train_step, trainer.close
        trainer.train_step = lambda: (starts.setdefault(trainer.step, time.perf_counter()), inner())[1]
        closing: list[float] = []
        trainer.close = lambda: (
            closing.append(time.perf_counter()),
            close(),
            closing.append(time.perf_counter()),
        )
        trainer.run()
    end, end_of_run = closing[0], closing[1] - closing[0]
    walls = {s: (starts.get(s + 1, end) - t) for s, t in starts.items()}
    measured = [s for s in walls if s >= warmup]
    total = sum(walls[s] for s in measured)
    cats = {c: sum(clock.by_step.get(s, {}).get(c, 0.0) for s in measured) for c in CATEGORIES[:-1]}
    cats["other"] = max(0.0, total - sum(cats.values()))

    def count(key):
        return sum(clock.by_step.get(s, {}).get(key, 0) for s in measured) / len(measured)

    return {
        "steps": len(measured),
        "seconds_per_step": total / max(1, len(measured)),
        "warmup_seconds": sum(walls[s] for s in walls if s < warmup),
        "setup_compile_seconds": clock.by_step.get(-1, {}).get("compile", 0.0),
        "programs_per_step": count("programs"),
        "programs_run_per_step": count("programs_run"),
        "seconds": cats,
        "share": {c: v / total for c, v in cats.items()},
        "warmup": warmup,
        "end_of_run_seconds": end_of_run,
        "outside_sampling_and_update": 1 - (cats["sampling"] + cats["update"] + cats["compile"]) / total,
        "per_step": [{"step": s, "wall": walls[s], **clock.by_step.get(s, {})} for s in sorted(walls)],
        "seconds_per_step_without_compile": (total - cats["compile"]) / max(1, len(measured)),
    }


def mars2_variant(base: dict, max_nodes: int, n_agents: int) -> dict:
    """mars2_tiny with `max_nodes` nodes per tree and `n_agents` agents (one policy each;
    the third agent gets a copy of the first one's policy settings)."""
    d = copy.deepcopy(base)
    names = list(d["agents"])
    while len(names) < n_agents:
        k = len(names)
        src = names[k % len(names)]
        new = f"agent{k}"
        pol = f"{d['agents'][src]['policy']}_{k}"
        d["policies"][pol] = copy.deepcopy(d["policies"][d["agents"][src]["policy"]])
        d["agents"][new] = {**d["agents"][src], "policy": pol}
        names.append(new)
    names = names[:n_agents]
    d["agents"] = {n: d["agents"][n] for n in names}
    used = {a["policy"] for a in d["agents"].values()}
    d["policies"] = {p: v for p, v in d["policies"].items() if p in used}
    d["workflow"].update(agents=names, max_nodes=max_nodes, stop_on_solve=False)
    return d


def demo_models(demo_dir: Path | None, out: Path, settings) -> tuple[dict[str, Path], str]:
    """The demo's warm-started checkpoints: those of a finished `python -m marljax.demo` run in
    `demo_dir`, else made under `out` (the demo's models and SFT stage); and where they came from."""
    from marljax.demo.models import FAMILIES, ensure_models
    from marljax.demo.pipeline import warm_start
    from marljax.rewards import SandboxPool

    if demo_dir is not None:
        found = {name: demo_dir / "models" / f"{name}-sft" for name in FAMILIES}
        if all((path / "config.json").exists() for path in found.values()):
            return found, f"the SFT checkpoints of {demo_dir}"
    start = time.perf_counter()
    with SandboxPool(max_workers=2) as pool:
        models = ensure_models(out / "models", pool, seed=settings.seed)
    made = warm_start(out, models, settings)
    return (
        made,
        f"made here by the demo's SFT stage ({settings.sft_steps} steps, {time.perf_counter() - start:.0f} s)",
    )


def demo_breakdown(
    warmup: int, steps: int, demo_dir: Path | None = None, methods: tuple[str, ...] | None = None, **settings
) -> dict:
    """The demo's RL runs (`marljax.demo.pipeline`; all three unless `methods` names some) on its
    warm-started models, which write code that runs, so the sandbox's share is real."""
    from marljax.demo.pipeline import METHODS, DemoConfig
    from marljax.demo.pipeline import run_config as demo_config

    s = DemoConfig(**{**settings, "rl_steps": warmup + steps})
    unknown = set(methods or ()) - set(METHODS)
    if unknown:
        raise ValueError(f"unknown demo methods {sorted(unknown)}; the demo runs {list(METHODS)}")
    with tempfile.TemporaryDirectory(prefix="marljax-bench-demo-") as tmp:
        models, origin = demo_models(demo_dir, Path(tmp), s)
        runs = {
            f"demo_{method}": measure(
                demo_config(method, Path(tmp) / method, models, agents, s), warmup, steps
            )
            for method, agents in METHODS.items()
            if methods is None or method in methods
        }
    return {"models": origin, "runs": runs}


def load(name: str) -> dict:
    return yaml.safe_load((ROOT / "configs" / name).read_text())


# mode -> (grpo warm-up + measured steps, mars2 warm-up + measured steps, scaling runs' steps, scaling grid)
MODES = {
    "smoke": ((1, 1), None, None, []),
    "quick": ((1, 3), (1, 2), None, []),
    "full": ((2, 28), (1, 4), (1, 2), [(4, 2), (16, 2), (8, 1), (8, 3)]),
}  # grpo_tiny: its 30 steps
# mode -> demo warm-up + measured steps; the demo compiles new shapes for several steps (refinement
# prompts grow), so its warm-up is longer. Smoke mode leaves the demo out (making its models takes
# minutes); tests/test_demo_and_notebooks.py measures it on the quick demo's models instead.
DEMO = {"smoke": None, "quick": (2, 3), "full": (6, 10)}
SMOKE = {
    "sampler": {"max_new_tokens": 8},
    "data": {"batch_size": 2, "source": {"kind": "synthetic", "n_train": 4, "difficulty": 1}},
    "workflow": {"kind": "grpo", "group_size": 2},
}


def run(mode: str = "full", demo_dir: Path | None = None) -> dict:
    (gw, gs), mars2_steps, scale_steps, grid = MODES[mode]
    grpo, mars2 = load("grpo_tiny.yaml"), load("mars2_tiny.yaml")
    if mode == "smoke":
        for k, v in SMOKE.items():
            grpo[k] = {**grpo.get(k, {}), **v}
        grpo["policies"]["main"].update(buffer={"threshold": 4}, micro_batch_size=4)
    out = {"warmup_steps": gw, "steps": gs, "breakdown": {}, "mars2_scaling": []}
    out["breakdown"]["grpo_tiny"] = run_config(grpo, gw, gs)
    if mars2_steps:
        out["breakdown"]["mars2_tiny"] = run_config(mars2, *mars2_steps)
        out["mars2_steps"] = mars2_steps
    if grid:
        out["mars2_scaling"].append({"max_nodes": 8, "agents": 2, **out["breakdown"]["mars2_tiny"]})
        for nodes, agents in grid:
            r = run_config(mars2_variant(mars2, nodes, agents), *scale_steps)
            out["mars2_scaling"].append({"max_nodes": nodes, "agents": agents, **r})
        out["mars2_scaling"].sort(key=lambda r: (r["agents"], r["max_nodes"]))
    if DEMO[mode]:
        demo = demo_breakdown(*DEMO[mode], demo_dir)
        out["demo_models"] = demo["models"]
        out["breakdown"].update(demo["runs"])
    out["markdown"] = markdown(out)
    return out


def markdown(out: dict) -> str:
    def pct(x):
        return f"{100 * x:.0f}%"

    lines = [
        "Shares of the wall time of the measured steps (after the warm-up steps; exclusive time of the "
        "wrapped calls; compile = lowering + XLA compilation wherever it happened).\n",
        "| run | warm-up + measured steps | s/step | "
        + " | ".join(CATEGORIES)
        + " | programs run / sent to the pool per step | outside sampling+update+compile | end of run (s) |",
        "|---|---|---|" + "---|" * (len(CATEGORIES) + 3),
    ]
    for name, r in out["breakdown"].items():
        lines.append(
            f"| {name} | {r['warmup']} + {r['steps']} | {r['seconds_per_step']:.2f} | "
            + " | ".join(pct(r["share"][c]) for c in CATEGORIES)
            + f" | {r['programs_run_per_step']:.0f} / {r['programs_per_step']:.0f} "
            f"| {pct(r['outside_sampling_and_update'])} | {r['end_of_run_seconds']:.2f} |"
        )
    if out.get("demo_models"):
        lines += [
            "",
            "demo_*: the embedded demo's three RL runs (`marljax.demo.pipeline` settings, programs "
            f"run in the real sandbox); models: {out['demo_models']}.",
        ]
    idle = [
        f"{name} ({r['programs_per_step']:.0f} per step)"
        for name, r in out["breakdown"].items()
        if r["programs_per_step"] and not r["programs_run_per_step"]
    ]
    if idle:
        lines += [
            "",
            "None of the scored programs of " + ", ".join(idle) + " reached the sandbox: random tiny "
            "models write nothing that parses, which is scored in-process (no_code / syntax_error). "
            "Real runs pay about one program / (pool programs/s of section 6) per scored program on top.",
        ]
    if out["mars2_scaling"]:
        lines += [
            "",
            "MARS2 cost against nodes per tree and team size (mars2_tiny, one policy per agent, "
            "stop_on_solve off; seconds per step over the measured steps):\n",
            "| agents | max_nodes | nodes scored / step | s/step | s/step without compile | compile | sampling "
            "| sandbox | update | rest |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in out["mars2_scaling"]:
            sec, n = r["seconds"], r["steps"]
            rest = sum(sec[c] for c in ("advantages", "metrics", "logging", "checkpoint", "other"))
            lines.append(
                f"| {r['agents']} | {r['max_nodes']} | {r['programs_per_step']:.0f} | "
                f"{r['seconds_per_step']:.2f} | {r['seconds_per_step_without_compile']:.2f} | "
                + " | ".join(
                    f"{x / n:.2f}"
                    for x in (sec["compile"], sec["sampling"], sec["sandbox"], sec["update"], rest)
                )
                + " |"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=sorted(MODES), default="full")
    ap.add_argument("--json", default=os.path.join(tempfile.gettempdir(), "marljax_bench_rl.json"))
    ap.add_argument(
        "--demo-dir",
        type=Path,
        help="a finished `python -m marljax.demo --out DIR` run whose "
        "SFT checkpoints to use (default: make them, about 2 minutes)",
    )
    args = ap.parse_args()
    out = run(args.mode, args.demo_dir)
    print(out["markdown"])
    Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
