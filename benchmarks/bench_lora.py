"""Three levels of agent sharing for a team on one base model: peak memory and step time, side by side.

    python benchmarks/bench_lora.py [--smoke | --quick] [--out results.json]

Level 1: one shared policy (the agents differ by role prompts). Level 2: one LoRA adapter per agent
on one frozen base (`lora:` policies sharing the base). Level 3: an independent copy of the model
per agent. For each level and team size, one child process builds the team and runs two steps; a
step is sampling every agent's prompts through `PolicyGenerator` (level 1: one sampler call;
level 2: one call, every row with its own adapter; level 3: one call per agent) and one RL update of
every policy. The second step is timed (the first compiles); the peak is the child's resident
memory high-water mark (VmHWM: parameters, optimiser states, compiled programs and the
runtime), overall and, where Linux lets it be reset, of building the team, of sampling and of the
updates alone. Before a child starts, `marljax.train.memory`'s estimate of the team decides whether it
fits the memory available; one that does not is reported with its estimate only.

A second measurement: sampling with A adapters of one base in one call against A calls of one
adapter each (the same rows and tokens in total), and the base model without adapters the same two
ways, for one or more new-token counts (one token: the prefill; the decode phase is a longer call
minus that), all interleaved after every shape has compiled, median of the repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GiB = 2**30
# on a GPU the parent asks the device for its memory and the children measure their peaks: neither may
# take three quarters of the device up front (JAX's default there)
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

# the 0.5B Qwen shape with LoRA rank 16: what the quick and full modes measure
QWEN_05B = dict(shape="qwen2.5-0.5b", rank=16, rows=2, prompt=32, new=8, adapters=4, sample_rows=4, repeats=2)
MODES = {
    # shape (a marljax preset), team sizes, adapter rank, samples per agent, prompt and new tokens;
    # sampling comparison: `adapters` x `sample_rows` rows, each `sample_new` token count
    "smoke": dict(
        shape="tiny-qwen3",
        teams=(2,),
        rank=4,
        rows=2,
        prompt=12,
        new=4,
        adapters=4,
        sample_rows=2,
        sample_new=(1, 4),
        base_reference=False,  # compiles as many programs again
        repeats=1,
    ),
    "quick": {**QWEN_05B, "teams": (2,), "sample_new": (1, 8)},
    "full": {**QWEN_05B, "teams": (2, 4, 8), "sample_new": (1, 8, 64)},
    # on an accelerator: bfloat16 compute (float32 master weights for training, bfloat16 weights
    # for the sampling comparison, as a sampler holds them there)
    # (calls there take milliseconds: more rounds for steadier ratios)
    "gpu": {**QWEN_05B, "teams": (2, 4, 8), "sample_new": (1, 8, 64), "dtype": "bfloat16", "repeats": 7},
}
LEVELS = {1: "shared policy", 2: "LoRA adapters", 3: "independent copies"}


def vm_hwm() -> int:
    """This process's peak resident memory in bytes (Linux), else ru_maxrss."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def on_accelerator() -> bool:
    import jax

    return jax.default_backend() != "cpu"


def peak_bytes() -> int:
    """The high-water mark this benchmark reports: of the device's memory on an accelerator (the
    allocator's peak in use), of this process's resident memory on a CPU."""
    if on_accelerator():
        import jax

        return int((jax.local_devices()[0].memory_stats() or {}).get("peak_bytes_in_use", 0))
    return vm_hwm()


def reset_peak() -> bool:
    """Start a new resident high-water mark (Linux: `/proc/self/clear_refs`); False where that
    cannot be done (a device's peak cannot be reset from JAX)."""
    if on_accelerator():
        return False
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def live_bytes() -> int:
    """Bytes of the distinct device buffers behind all live arrays: two `jax.Array` objects can
    share one buffer (`jax.device_put` onto the device an array is already on returns a new
    object over the same buffer), and summing every array's `nbytes` would count it twice."""
    import jax

    buffers = {}
    for x in jax.live_arrays():
        try:
            key = tuple(s.data.unsafe_buffer_pointer() for s in x.addressable_shards)
        except Exception:  # a deleted or non-addressable array: count it on its own
            key = id(x)
        buffers[key] = x.nbytes
    return sum(buffers.values())


def available_bytes() -> int | None:
    if on_accelerator():
        import jax

        return (jax.local_devices()[0].memory_stats() or {}).get("bytes_limit")
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


# ----------------------------------------------------------------------------- the team
def policy_configs(level: int, team: int, p: dict) -> dict:
    """name -> PolicyConfig of a level's team."""
    from marljax.train.config import PolicyConfig

    model = {"preset": p["shape"], "seed": 0, "dtype": p.get("dtype", "float32")}
    common = {"micro_batch_size": p["rows"], "optimizer": {"lr": 1e-5}}
    if level == 1:
        return {"shared": PolicyConfig.model_validate({"model": model, **common})}
    if level == 2:
        lora = {"rank": p["rank"], "alpha": 2 * p["rank"]}
        return {
            f"a{i}": PolicyConfig.model_validate({"model": model, "lora": {**lora, "seed": i}, **common})
            for i in range(team)
        }
    return {
        f"a{i}": PolicyConfig.model_validate({"model": {**model, "seed": i}, **common}) for i in range(team)
    }


def team_estimate(level: int, team: int, p: dict, platform: str | None = None) -> int:
    """`marljax.train.memory`'s estimate of the team on one device (bytes), for `platform` (default:
    this process's JAX backend)."""
    import jax

    from marljax.models import ModelConfig
    from marljax.train import memory

    config = ModelConfig.preset(p["shape"], dtype=p.get("dtype", "float32"))
    seq = p["prompt"] + p["new"]
    ests = [
        memory.estimate(
            config,
            name=name,
            micro_batch_size=p["rows"],
            seq_len=seq,
            lora=None if c.lora is None else c.lora.spec(),
            base_key="base" if c.lora is not None else None,
            platform=platform or jax.default_backend(),
            sampler_slots=team * p["rows"],  # as `child_team`'s sampler
        )
        for name, c in policy_configs(level, team, p).items()
    ]
    return memory.team_bytes(ests)


def child_team(level: int, team: int, p: dict) -> dict:
    import jax
    import numpy as np

    from marljax.train.config import SamplerConfig
    from marljax.train.generation import PolicyGenerator
    from marljax.train.policy import BaseStore, Policy
    from marljax.workflows.base import Agent
    from marljax.workflows.types import Rows

    t0 = time.perf_counter()
    bases = BaseStore()
    policies = {n: Policy(n, c, bases=bases) for n, c in policy_configs(level, team, p).items()}
    names = sorted(policies)
    agents = [Agent(f"agent{i}", names[0] if level == 1 else names[i]) for i in range(team)]
    sampler = SamplerConfig(max_new_tokens=p["new"], temperature=1.0, slots=team * p["rows"])
    gen = PolicyGenerator(policies, sampler)
    rng = np.random.default_rng(0)
    # every prompt the same words in another order after a fixed first one, so every prompt has the
    # same token count (the tokenizer splits at spaces) and every agent's update the same shapes:
    # random lengths would make a larger team more likely to draw a longer prompt, and its larger
    # buckets would pass for a cost per agent
    words = ["def", "solve(xs):", "return", "sorted(xs)", "agent", "role", "problem"]
    pool = [str(w) for w in rng.choice(words, p["prompt"])]

    def n_tokens(text: str) -> int:
        return len(policies[names[0]].turns.encode_prompt(text))

    k = 1
    while k < len(pool) and n_tokens(" ".join(["#", *pool[: k + 1]])) <= p["prompt"]:
        k += 1
    bag = pool[:k]

    def prompt() -> str:
        return " ".join(["#", *rng.permutation(bag)])

    build_s = time.perf_counter() - t0
    steps = []
    build_peak = peak_bytes()
    # where a peak cannot be reset (a device), each phase's is the peak so far
    cumulative = on_accelerator()
    for step in range(2):
        prompts = [prompt() for _ in agents]
        fresh = reset_peak()
        t = time.perf_counter()
        gens = gen.generate(list(zip(agents, prompts)), n=p["rows"], seed=step)
        sample_s = time.perf_counter() - t
        sample_peak = peak_bytes() if fresh or cumulative else None
        by_policy: dict[str, list] = {}
        for agent, row in zip(agents, gens):
            for g in row:
                by_policy.setdefault(agent.policy, []).append((g, float(rng.normal())))
        batches = {
            name: Rows(
                [g.prompt_ids for g, _ in drawn],
                [g.completion_ids for g, _ in drawn],
                [g.logprobs for g, _ in drawn],
                advantage=[a for _, a in drawn],
                agent=name,
            )
            for name, drawn in by_policy.items()
        }
        fresh = reset_peak()
        t = time.perf_counter()
        for name, rows in batches.items():
            policies[name].update(rows)
        jax.block_until_ready([pol.params for pol in policies.values()])
        steps.append(
            {
                "sample_s": sample_s,
                "update_s": time.perf_counter() - t,
                "sample_peak": sample_peak,
                "update_peak": peak_bytes() if fresh or cumulative else None,
            }
        )
    base_buffers = len(
        {
            x.unsafe_buffer_pointer()
            for pol in policies.values()
            for x in jax.tree.leaves(pol.params if pol.learner.frozen is None else pol.learner.frozen)
        }
    )
    return {
        "level": level,
        "team": team,
        "build_s": build_s,
        "first_step_s": steps[0]["sample_s"] + steps[0]["update_s"],
        "sample_s": steps[1]["sample_s"],
        "update_s": steps[1]["update_s"],
        "step_s": steps[1]["sample_s"] + steps[1]["update_s"],
        # the high-water mark of the whole child, and of each phase where it can be reset: building
        # the team (loading or initialising the base), sampling, updating (each step's highest)
        "memory": "device" if cumulative else "RSS",
        "peak": max([build_peak] + [s[k] or 0 for s in steps for k in ("sample_peak", "update_peak")]),
        "build_peak": build_peak,
        "sample_peak": max((s["sample_peak"] or 0) for s in steps) or None,
        "update_peak": max((s["update_peak"] or 0) for s in steps) or None,
        # what the arrays hold after the step (parameters, optimiser states, caches): the resident
        # state, without the transients and the allocator's retained memory in the peak
        "live_bytes": live_bytes(),
        "prompt_tokens": sorted({n_tokens(prompt()) for _ in range(8)}),
        "model_buffers": base_buffers,
    }


def child_sampling(p: dict) -> dict:
    """A adapters x R rows: one call with every adapter's rows against A calls of R rows each, and
    the base model alone the same two ways (what batching the rows can give on this machine,
    with no adapter at all), for each new-token count of the mode, all interleaved. With one new
    token a call is the prompts' prefill (and the first token's choice); the decode phase is the
    difference to a longer call."""
    import jax
    import numpy as np
    from bench_common import interleaved

    from marljax.models import ModelConfig, init_model
    from marljax.models.decoder import get_params
    from marljax.models.lora import LoraSpec, init_adapter, stack_adapters
    from marljax.sampler import SamplingParams, Schedule, generate, get_engine

    dtype = p.get("dtype", "float32")
    config = ModelConfig.preset(p["shape"], dtype=dtype, param_dtype=dtype)
    base = get_params(init_model(config, seed=0))
    spec = LoraSpec(rank=p["rank"], alpha=2.0 * p["rank"])
    adapters = []
    for i in range(p["adapters"]):  # non-zero b, as after training
        ad = init_adapter(config, spec, jax.random.key(i))
        ad = {
            n: {"a": w["a"], "b": 0.01 * jax.random.normal(jax.random.key(100 + i), w["b"].shape)}
            for n, w in ad.items()
        }
        adapters.append((spec, ad))
    A, rows = p["adapters"], p["sample_rows"]
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, min(1000, config.vocab_size), p["prompt"]).tolist() for _ in range(A * rows)]
    together = {**base, "lora": stack_adapters(adapters)}
    alone = [{**base, "lora": stack_adapters([ad])} for ad in adapters]
    ids = [i // rows for i in range(A * rows)]
    # no end of sequence: every row generates exactly `new` tokens, whatever the random weights
    kw = dict(seed=1, eos_ids=[], schedule=Schedule(slots=A * rows))

    def calls_for(new: int) -> dict:
        def one_call(params, **extra):
            return lambda: generate(config, prompts, SamplingParams(new), params=params, **extra, **kw)

        def separate_calls(params_of):
            def call():
                for i in range(A):
                    part = prompts[i * rows : (i + 1) * rows]
                    generate(config, part, SamplingParams(new), params=params_of(i), **kw)

            return call

        out = {
            f"one_call/{new}": one_call(together, adapter=ids),
            f"separate_calls/{new}": separate_calls(lambda i: alone[i]),
        }
        if p.get("base_reference", True):
            out[f"base_one_call/{new}"] = one_call(base)
            out[f"base_separate_calls/{new}"] = separate_calls(lambda i: base)
        return out

    calls = {k: f for new in p["sample_new"] for k, f in calls_for(new).items()}
    for fn in calls.values():  # compile every shape first
        fn()
    engine = get_engine(config)
    compiles = engine.stats.compiles
    t = interleaved(calls, repeats=p["repeats"], warmup=0)
    out = {
        "adapters": A,
        "rows_per_adapter": rows,
        "prompt": p["prompt"],
        "compiles_while_timed": engine.stats.compiles - compiles,
        "settings": [],
    }
    first = min(p["sample_new"])
    kinds = sorted({k.split("/")[0] for k in calls})
    for new in p["sample_new"]:
        row = {"new": new}
        for k in kinds:
            row[k + "_s"] = t[f"{k}/{new}"]["seconds"]
            row[k + "_best_s"] = t[f"{k}/{new}"]["best_seconds"]
        if new > first:  # the decode phase: this call minus the prefill-only call, per side
            ref = next(r for r in out["settings"] if r["new"] == first)
            for k in kinds:
                row[k + "_decode_s"] = row[k + "_s"] - ref[k + "_s"]
        for pre in ("", "base_"):
            if pre + "one_call_s" in row:
                row[pre + "speedup"] = row[pre + "separate_calls_s"] / row[pre + "one_call_s"]
                row[pre + "speedup_best"] = row[pre + "separate_calls_best_s"] / row[pre + "one_call_best_s"]
            if pre + "one_call_decode_s" in row:
                row[pre + "decode_speedup"] = (
                    row[pre + "separate_calls_decode_s"] / row[pre + "one_call_decode_s"]
                )
        out["settings"].append(row)
    headline = next((r for r in out["settings"] if r["new"] == p["new"]), out["settings"][-1])
    out.update(
        one_call_s=headline["one_call_s"],
        separate_calls_s=headline["separate_calls_s"],
        speedup=headline["speedup"],
    )
    return out


# ----------------------------------------------------------------------------- parent
def _child(what: dict, timeout: float) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(what)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("JSON:")]
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr or proc.stdout)[-2000:], "returncode": proc.returncode}
    return json.loads(lines[-1][5:])


def run(mode: str = "full", timeout: float = 1800, teams=None, levels=None, sampling: bool = True) -> dict:
    """The table for `mode` (`teams`, `levels`: a subset of the mode's; `sampling`: with the
    sampling comparison)."""
    p = MODES[mode]
    rows, skipped = [], []
    for team in p["teams"] if teams is None else teams:
        for level in levels or LEVELS:
            est = team_estimate(level, team, p)
            avail = available_bytes()
            if avail is not None and est > 0.8 * avail:
                skipped.append({"level": level, "team": team, "estimate": est, "available": avail})
                rows.append({"level": level, "team": team, "estimate": est, "fits": False})
                continue
            res = _child({"kind": "team", "level": level, "team": team, "mode": mode}, timeout)
            rows.append({**res, "level": level, "team": team, "estimate": est, "fits": True})
    out = {
        "mode": mode,
        "shape": p["shape"],
        "dtype": p.get("dtype", "float32"),
        "rank": p["rank"],
        "rows": rows,
        "sampling": _child({"kind": "sampling", "mode": mode}, timeout) if sampling else None,
    }
    out.update(per_agent_cost(rows, p))
    out["markdown"] = markdown(out)
    return out


def per_agent_cost(rows: list[dict], p: dict) -> dict:
    """Level 2's memory per added agent as a share of the base's weights: between the smallest and
    the largest team measured (peak RSS, and the peaks of sampling and of the updates alone), and
    by the estimate."""
    from marljax.models import ModelConfig
    from marljax.train.memory import param_bytes

    base = param_bytes(ModelConfig.preset(p["shape"]))[0]
    level2 = sorted((r for r in rows if r["level"] == 2), key=lambda r: r["team"])
    out = {
        "base_bytes": base,
        "per_agent_measured": None,
        "per_agent_live": None,
        "per_agent_estimated": None,
    }
    if len(level2) >= 2:
        lo, hi = level2[0], level2[-1]
        n = hi["team"] - lo["team"]
        out["per_agent_estimated"] = (hi["estimate"] - lo["estimate"]) / n / base
        if "peak" in lo and "peak" in hi:
            out["per_agent_measured"] = (hi["peak"] - lo["peak"]) / n / base
            out["per_agent_live"] = (hi["live_bytes"] - lo["live_bytes"]) / n / base
            for phase in ("sample_peak", "update_peak"):
                if lo.get(phase) and hi.get(phase):
                    out[f"per_agent_{phase}"] = (hi[phase] - lo[phase]) / n / base
    return out


def markdown(out: dict) -> str:
    def gib(x):
        return f"{x / GiB:.2f}"

    kind = next((r["memory"] for r in out["rows"] if "memory" in r), "RSS")
    lines = [
        f"Shape {out['shape']} (random weights, {out.get('dtype', 'float32')} compute), LoRA rank {out['rank']} "
        "on q/k/v/o/gate/up/down; step = sample every agent's prompts + one update of every policy (second "
        "step; the first compiles). Memory: "
        + (
            "the device allocator's peak in use; the phase peaks are the peak so far (a device's peak "
            "cannot be reset)."
            if kind == "device"
            else "the process's peak resident memory (VmHWM), reset before each phase where Linux allows."
        ),
        "",
        f"| team | level | peak {kind} GiB | peak: build / sampling / updates GiB | live arrays GiB | estimate GiB "
        "| step s | sampling s | updates s | model copies |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    if not out["rows"]:
        lines = []
    for r in out["rows"]:
        name = f"{r['level']} ({LEVELS[r['level']]})"
        if not r.get("fits"):
            lines.append(
                f"| {r['team']} | {name} | does not fit | - | - | {gib(r['estimate'])} | - | - | - | - |"
            )
        elif "error" in r:
            lines.append(f"| {r['team']} | {name} | failed | - | - | {gib(r['estimate'])} | - | - | - | - |")
        else:
            phases = " / ".join(
                "-" if r.get(k) is None else gib(r[k]) for k in ("build_peak", "sample_peak", "update_peak")
            )
            lines.append(
                f"| {r['team']} | {name} | {gib(r['peak'])} | {phases} | {gib(r['live_bytes'])} | "
                f"{gib(r['estimate'])} | "
                f"{r['step_s']:.2f} | "
                f"{r['sample_s']:.2f} | {r['update_s']:.2f} | {r['model_buffers']} buffers |"
            )
    for key, what in (
        ("per_agent_measured", f"measured (peak {kind})"),
        ("per_agent_live", "measured (live arrays)"),
        ("per_agent_sample_peak", f"measured (peak {kind} while sampling)"),
        ("per_agent_update_peak", f"measured (peak {kind} while updating)"),
        ("per_agent_estimated", "estimated"),
    ):
        if out.get(key) is not None:
            lines += ["", f"Level 2, memory per added agent, {what}: {out[key]:.1%} of the base's weights."]
    s = out["sampling"]
    if s is None:
        pass
    elif "error" in s:
        lines += ["", "Sampling comparison failed."]
    else:
        lines += [
            "",
            f"Sampling {s['adapters']} adapters x {s['rows_per_adapter']} rows ({s['prompt']}-token prompts), "
            "median s; the base model without adapters the same two ways for reference:",
            "",
            "| new tokens | one call s | separate calls s | speedup (best) | decode phase speedup "
            "| base: one call s | base: separate s | base speedup | base decode speedup |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in s["settings"]:

            def num(key, unit="", r=r):
                return f"{r[key]:.2f}{unit}" if key in r else "-"

            lines.append(
                f"| {r['new']} | {num('one_call_s')} | {num('separate_calls_s')} | {num('speedup', 'x')} "
                f"({num('speedup_best', 'x')}) | {num('decode_speedup', 'x')} | {num('base_one_call_s')} | "
                f"{num('base_separate_calls_s')} | {num('base_speedup', 'x')} | {num('base_decode_speedup', 'x')} |"
            )
        lines += ["", f"Compilations while timed: {s['compiles_while_timed']}."]
    return "\n".join(lines)


def main(argv=None) -> dict | None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--smoke", action="store_true")
    g.add_argument("--quick", action="store_true")
    g.add_argument("--gpu", action="store_true", help="the full mode in bfloat16, for an accelerator")
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--sampling-only", action="store_true", help="only the sampling comparison")
    which.add_argument("--teams-only", action="store_true", help="only the teams (no sampling comparison)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--teams", type=int, nargs="+", help="team sizes (default: the mode's)")
    ap.add_argument("--levels", type=int, nargs="+", choices=sorted(LEVELS), help="levels (default: all)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        what = json.loads(args.child)
        p = MODES[what["mode"]]
        res = child_team(what["level"], what["team"], p) if what["kind"] == "team" else child_sampling(p)
        print("JSON:" + json.dumps(res), flush=True)
        return None
    mode = "smoke" if args.smoke else "quick" if args.quick else "gpu" if args.gpu else "full"
    out = run(
        mode, teams=[] if args.sampling_only else args.teams, levels=args.levels, sampling=not args.teams_only
    )
    print(out["markdown"])
    if args.out:
        args.out.write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
