"""All benchmarks side by side, one command; markdown + JSON.

    python benchmarks/run.py [--quick | --smoke] [--only SECTION ...] [--gpu] [--out DIR]
                             [--tunix-python PY] [--verl-python PY] [--demo-dir DIR]

Sections (in this order): peak (matmul FLOP/s, memory bandwidth), train (train step vs
transformers+torch), generate (sampler vs transformers and tunix), kernels (vs verl and
NumPy), rl (where an RL iteration's time goes), sandbox (programs/s), gpu (with --gpu:
Qwen2.5-0.5B-shaped MFU and decode roofline), real (only with `--only real`: a MARS2 step, eval,
checkpoint, kill, resume and export at the shapes of Qwen2.5-0.5B and Llama-3.2-1B; minutes, full
depth in full mode, 2 layers and 16 new tokens otherwise). `--quick` uses fewer repeats and steps and
skips the MARS2 scaling grid; `--smoke` only checks that every section runs (tiny shapes, no external
environments; used by tests/test_benchmarks_smoke.py).

Started from the command line, the harness restarts itself with host memory kept
(`marljax.host_memory`, as marljax's entry points do); the train section measures both
allocator settings in child processes.

Writes DIR/results.json and DIR/results.md (DIR defaults to $TMPDIR/marljax_bench) and
prints the markdown. Every ratio comes from calls of both sides interleaved in one process
(median of k). The machine's load is recorded: the load average when the harness starts,
and for each section the CPU used by *other* processes while it ran (from /proc/stat minus
this process tree's CPU time). A section is marked noisy when that exceeds 0.5 cores, the
harness when its starting 1-minute load average exceeds 0.5.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

SECTIONS = ("peak", "train", "generate", "kernels", "rl", "sandbox", "gpu", "real", "lora")
OPT_IN = ("gpu", "real", "lora")  # left out unless asked for (--gpu, --only): hardware or minutes
TITLES = {
    "peak": "1. Machine peak",
    "train": "2. Train step",
    "generate": "3. Generation",
    "kernels": "4. RL kernels over 1 M tokens",
    "rl": "5. RL iteration breakdown",
    "sandbox": "6. Sandbox",
    "gpu": "7. GPU",
    "real": "8. Rehearsal at real shapes",
    "lora": "9. Agent sharing: shared policy, LoRA adapters, independent copies",
}
NOISY_CORES = 0.5


# ----------------------------------------------------------------------------- machine and load
def _busy_seconds() -> float | None:
    """CPU seconds spent busy by the whole machine (Linux /proc/stat), or None."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = v
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class LoadMeter:
    """Average number of cores that other processes kept busy between start and stop."""

    def __enter__(self):
        self.t, self.busy, self.own = time.perf_counter(), _busy_seconds(), _own_seconds()
        self.loadavg_start = os.getloadavg()
        return self

    def __exit__(self, *exc):
        wall = time.perf_counter() - self.t
        busy = _busy_seconds()
        self.result = {
            "wall_s": wall,
            "loadavg_start": self.loadavg_start,
            "loadavg_end": os.getloadavg(),
            "other_processes_cores": None,
        }
        if busy is not None and self.busy is not None:
            other = max(0.0, (busy - self.busy) - (_own_seconds() - self.own)) / max(wall, 1e-9)
            self.result["other_processes_cores"] = other
        self.result["noisy"] = (self.result["other_processes_cores"] or 0.0) > NOISY_CORES


def machine_info() -> dict:
    cpu = platform.processor()
    with contextlib.suppress(OSError, StopIteration):
        cpu = next(
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        )
    mem = None
    with contextlib.suppress(OSError, StopIteration):
        mem = (
            int(
                next(
                    ln.split()[1]
                    for ln in Path("/proc/meminfo").read_text().splitlines()
                    if ln.startswith("MemTotal")
                )
            )
            / 2**20
        )
    versions = {}
    for pkg in ("jax", "jaxlib", "flax", "optax", "torch", "transformers", "numpy"):
        try:
            versions[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            versions[pkg] = None
    from marljax.host_memory import ENV, SWITCH

    return {
        "platform": platform.platform(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": mem,
        "python": platform.python_version(),
        "versions": versions,
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "host_memory": {k: os.environ.get(k) for k in (*ENV, SWITCH)},
    }


# ----------------------------------------------------------------------------- sections
def run_section(name: str, mode: str, args, results: dict):
    if name == "peak":
        import bench_peak

        return bench_peak.run(mode)
    if name == "train":
        import bench_train

        return bench_train.run(mode, peak_flops=results.get("peak", {}).get("peak_flops"))
    if name == "generate":
        import bench_generate

        res = bench_generate.run(mode, tunix_python=args.tunix_python)
        res["longtail"] = bench_generate.run_longtail(mode, tunix_python=args.tunix_python)
        res["markdown"] += "\n\n" + res["longtail"]["markdown"]
        return res
    if name == "kernels":
        import bench_kernels

        return bench_kernels.run(mode, verl_python="" if mode == "smoke" else args.verl_python)
    if name == "rl":
        import bench_rl

        return bench_rl.run(mode, args.demo_dir)
    if name == "sandbox":
        import bench_sandbox

        return bench_sandbox.run(mode)
    if name == "gpu":
        import bench_gpu

        return bench_gpu.run(mode, peak=results.get("peak"))
    if name == "real":
        import bench_real

        if mode != "full":
            return bench_real.run(layers=2, max_new_tokens=16, repeats=1)
        host_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
        if host_gib >= 32:  # both models update: about 28-30 GiB in bfloat16 with remat
            return bench_real.run(dtype="bfloat16", remat=True)
        # what fits 24 GiB: the Qwen shape updates in float32, the Llama shape only samples (bfloat16)
        return bench_real.run(
            dtype="float32", llama_dtype="bfloat16", llama_update=False, remat=True, compare_apart=True
        )
    if name == "lora":
        import bench_lora

        return bench_lora.run(mode)
    raise ValueError(name)


# ----------------------------------------------------------------------------- targets
def targets(results: dict) -> list[dict]:
    """The issues' targets (#9, #4, #25), each met / not met / not measured."""
    out = []

    def add(what, value, goal, fmt="{:.2f}x", best=None):
        shown = "-" if value is None else fmt.format(value)
        if value is not None and best is not None:
            shown += f" (best of each: {fmt.format(best)})"
        out.append(
            {
                "target": what,
                "value": value,
                "best": best,
                "goal": goal,
                "shown": shown,
                "status": "not measured" if value is None else ("met" if value >= goal else "NOT met"),
            }
        )

    gen = {(r["batch"], r["mode"]): r for r in results.get("generate", {}).get("rows", [])}
    for b in (8, 32):
        g, p = gen.get((b, "greedy"), {}), gen.get((b, "top_p=0.9"), {})
        suffix = "" if b == 8 else " (batch 32, not an issue target)"
        if b == 8 or g:
            add(
                f"generation greedy vs transformers >= 2x{suffix}",
                g.get("vs_transformers"),
                2.0,
                best=g.get("vs_transformers_best"),
            )
            add(
                f"generation greedy vs tunix >= 1.5x{suffix}",
                g.get("vs_tunix"),
                1.5,
                best=g.get("vs_tunix_best"),
            )
            add(
                f"generation top-p vs transformers >= 2x{suffix}",
                p.get("vs_transformers"),
                2.0,
                best=p.get("vs_transformers_best"),
            )
            add(
                f"generation top-p vs tunix >= 2x{suffix}",
                p.get("vs_tunix"),
                2.0,
                best=p.get("vs_tunix_best"),
            )
    tail = {r["engine"]: r for r in results.get("generate", {}).get("longtail", {}).get("rows", [])}
    cont = tail.get("continuous", {})
    add("long-tailed generation: continuous vs static >= 2x (#25)", cont.get("vs_static"), 2.0)
    steps = cont.get("slot_steps_per_token")
    add(  # lower is better: the goal is met when 1.3 / value >= 1
        "long-tailed generation: slot-steps per useful token <= 1.3 (#25; shown as 1.3 / value)",
        None if steps is None else 1.3 / steps,
        1.0,
    )
    # the setting marljax's entry points run with (the glibc-default rows are shown for comparison)
    train = {
        r["size"]: r
        for r in results.get("train", {}).get("rows", [])
        if r.get("host_memory") != "glibc default"
    }
    add(
        "train step tiny vs transformers >= 2x",
        train.get("tiny", {}).get("speedup"),
        2.0,
        best=train.get("tiny", {}).get("speedup_best"),
    )
    add(
        "train step 50M vs transformers >= 1.2x",
        train.get("50m", {}).get("speedup"),
        1.2,
        best=train.get("50m", {}).get("speedup_best"),
    )
    add(
        "train step 50M >= 50% of measured peak",
        train.get("50m", {}).get("marljax", {}).get("fraction_of_peak"),
        0.5,
        "{:.0%}",
    )
    real = results.get("real", {}).get("compare", {})
    add(
        "update step, Qwen2.5-0.5B shape (MARS2 batch) vs transformers >= 1.2x",
        real.get("speedup"),
        1.2,
        best=real.get("speedup_best"),
    )
    k = results.get("kernels", {})
    add(
        "kernels vs verl (GRPO loop estimator) >= 3x",
        k.get("speedup_vs_verl"),
        3.0,
        best=k.get("speedup_best_vs_verl"),
    )
    add(
        "kernels vs verl (vectorised GRPO) >= 3x",
        k.get("speedup_vs_verl_vectorized"),
        3.0,
        best=k.get("speedup_best_vs_verl_vectorized"),
    )
    lora = results.get("lora", {})
    if lora:
        share = lora.get("per_agent_measured")
        out.append(
            {
                "target": "LoRA adapters (level 2): memory <= base + 10% per agent (rank 16, measured)",
                "value": share,
                "goal": 0.10,
                "shown": "-" if share is None else f"{share:.1%} per agent",
                "status": "not measured" if share is None else ("met" if share <= 0.10 else "NOT met"),
            }
        )
        for r in lora.get("sampling", {}).get("settings", []):
            add(
                f"sampling 4 adapters in one call vs 4 calls >= 3x ({r['new']} new tokens)",
                r["speedup"],
                3.0,
                best=r["speedup_best"],
            )
    for name, r in results.get("rl", {}).get("breakdown", {}).items():
        share = r.get("outside_sampling_and_update")
        out.append(
            {
                "target": f"RL iteration ({name}): <= 10% outside sampling and updates",
                "value": share,
                "goal": 0.10,
                "shown": "-" if share is None else f"{share:.0%}",
                "status": "not measured" if share is None else ("met" if share <= 0.10 else "NOT met"),
            }
        )
    return out


# ----------------------------------------------------------------------------- report
def markdown(report: dict) -> str:
    m, load = report["machine"], report["load"]
    noisy = report["noisy"]
    v = ", ".join(f"{k} {x}" for k, x in m["versions"].items() if x)
    lines = [
        f"# marljax benchmarks ({report['mode']})",
        "",
        f"Machine: {m['platform']}, {m['cpu']}, {m['cores']} cores, "
        f"{m['memory_gib']:.0f} GiB RAM; Python {m['python']}; {v}."
        if m.get("memory_gib")
        else f"Machine: {m['platform']}, {m['cpu']}, {m['cores']} cores.",
        f"Date: {m['date']}. Command: `{report['command']}`. Host memory settings: "
        + ", ".join(f"{k}={v}" for k, v in m.get("host_memory", {}).items())
        + ".",
        f"Load average when the harness started: {', '.join(f'{x:.2f}' for x in load['loadavg_start'])}"
        + (
            " -- **noisy**: the machine was shared; ratios come from interleaved calls, absolute numbers "
            "are lower bounds."
            if noisy
            else "."
        ),
        "",
    ]
    for name in report["sections"]:
        if name not in report["results"]:
            continue
        sec = report["results"][name]
        meter = report["section_load"].get(name, {})
        lines += [f"## {TITLES[name]}", ""]
        if "error" in sec:
            lines += ["**failed**:", "```", sec["error"][-2000:], "```", ""]
            continue
        other = meter.get("other_processes_cores")
        lines += [
            sec.get("markdown", ""),
            "",
            f"_{meter.get('wall_s', 0):.0f} s; other processes used "
            + ("?" if other is None else f"{other:.2f}")
            + " cores meanwhile"
            + (" -- **noisy**_" if meter.get("noisy") else "_"),
            "",
        ]
    lines += [
        "## Targets (issues #9 and #4)",
        "",
        "Status from the medians of interleaved calls; on a noisy run the best-of-each ratio is shown too.",
        "",
        "| target | measured | status |",
        "|---|---|---|",
    ]
    lines += [f"| {t['target']} | {t['shown']} | {t['status']} |" for t in report["targets"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    if argv is None:  # from the command line: run as marljax's entry points do (see marljax.host_memory)
        from marljax.host_memory import restart_with_kept_memory

        restart_with_kept_memory([str(Path(__file__).resolve()), *sys.argv[1:]])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="fewer repeats and steps, no MARS2 scaling grid")
    g.add_argument("--smoke", action="store_true", help="tiny shapes: checks that every section runs")
    ap.add_argument("--only", nargs="+", choices=SECTIONS, help="run only these sections")
    ap.add_argument("--gpu", action="store_true", help="add the GPU section")
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "marljax_bench"))
    ap.add_argument("--tunix-python", default="/tmp/tunixenv/bin/python")
    ap.add_argument("--verl-python", default="/tmp/verlenv/bin/python")
    ap.add_argument(
        "--demo-dir",
        type=Path,
        help="rl: use the SFT checkpoints of this finished demo run (default: make them, about 2 minutes)",
    )
    args = ap.parse_args(argv)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    sections = [
        s
        for s in SECTIONS
        if (s in args.only if args.only else (s not in OPT_IN or (s == "gpu" and args.gpu)))
    ]
    if "gpu" in sections:
        # the GPU section runs transformers beside marljax in this process, and JAX's allocator
        # keeps every byte it has grown to: cap it (read when JAX first touches the device)
        os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.45")
    needed = list(sections)
    if ("train" in sections or "gpu" in sections) and "peak" not in sections:
        needed.insert(0, "peak")  # train and gpu report against the measured peak

    report = {
        "mode": mode,
        "command": "python benchmarks/run.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": machine_info(),
        "load": {"loadavg_start": os.getloadavg()},
        "sections": needed,
        "results": {},
        "section_load": {},
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in needed:
        print(f"[run.py] {name} ...", file=sys.stderr, flush=True)
        with LoadMeter() as meter:
            try:
                res = run_section(name, mode, args, report["results"])
            except Exception:  # noqa: BLE001 - one failing section must not hide the others
                res = {"error": traceback.format_exc()}
                print(res["error"], file=sys.stderr)
        report["results"][name] = res
        report["section_load"][name] = meter.result
        md = write(report, out)  # after every section, so a long run keeps what it has measured
    print(md)
    print(f"[run.py] wrote {out / 'results.md'} and {out / 'results.json'}", file=sys.stderr)
    return report


def write(report: dict, out: Path) -> str:
    report["load"]["loadavg_end"] = os.getloadavg()
    report["noisy"] = report["load"]["loadavg_start"][0] > NOISY_CORES or any(
        m["noisy"] for m in report["section_load"].values()
    )
    report["targets"] = targets(report["results"])
    md = markdown(report)
    (out / "results.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "results.md").write_text(md)
    return md


if __name__ == "__main__":
    main()
