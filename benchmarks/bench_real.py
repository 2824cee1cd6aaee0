"""Rehearsal at real shapes: a heterogeneous MARS2 step with Qwen2.5-0.5B- and Llama-3.2-1B-shaped models.

    python benchmarks/bench_real.py [--layers N] [--max-new-tokens 256] [--repeats 2] [--out DIR]
    python benchmarks/bench_real.py --dtype float32 --llama-dtype bfloat16 --no-llama-update \
        --remat --compare-apart          # what fits the full depth in 24 GiB of host memory

Random checkpoints with the real shapes, vocabularies, special-token ids, chat templates and
generation configs (`marljax.testing.real_shapes`), then, each phase in its own process so that
its peak host memory is its own:

1. build: write both checkpoints (one layer at a time) and their tokenizers;
2. train: `Trainer` on a MARS2 run with both policies (alice on the Qwen shape, bob on the
   Llama shape; one tree of 4 nodes, one generator round), one `train_step` (sampling, sandbox,
   both updates), `evaluate` (greedy, both agents), `save`; then the process is SIGKILLed;
3. resume: a fresh process restores the checkpoint (its parameters must hash equal to those
   saved), exports both policies to HF directories and reloads them in transformers (logits on a
   few tokens must equal marljax's);
4. compare: the Qwen policy's update on the very samples of step 2, marljax's compiled trainer
   step against transformers + torch (the PPO loss of `bench_train`), interleaved in one process,
   or with `--compare-apart` one side per process, alternating (the two float32 sides of the
   full-depth 0.5B shape do not fit in one 24 GiB process); median.

Per phase: wall time, XLA compile time inside it, peak RSS, and for the train phase the
memory estimate of `marljax.train.memory` (both policies' parameters and moments, plus the
larger of an update and a sampling call). The two updates of the step are timed one after the
other (the trainer would dispatch both at once; on one CPU device they queue anyway).
`--dtype` sets parameters, compute and Adam moments of the Qwen policy and of the torch side,
`--llama-dtype` the Llama policy's; `--no-llama-update` lets the Llama policy sample without
updating (with AdamW its update does not fit in 24 GiB at full depth); `--remat` rematerialises
the layers in the step's updates. A parent process watches every child's RSS and kills it above
`--max-rss-gib`; `--phases` reruns some phases in a kept `--work` directory.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import pickle
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parents[1]
POLICIES = {"coder_qwen": "qwen2.5-0.5b", "coder_llama": "llama-3.2-1b"}  # policy -> shape
MARKUP = {  # what a chat prompt of each family must start and end with
    "qwen2.5-0.5b": ("<|im_start|>system\n", "<|im_end|>\n<|im_start|>assistant\n"),
    "llama-3.2-1b": (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n",
        "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    ),
}
GiB = 2**30


# ----------------------------------------------------------------------------- child helpers
def peak_rss() -> int:
    """Peak resident set size of this process so far, bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class Phases:
    """Wall time, XLA compile time (from jax.monitoring) and peak RSS after each phase."""

    def __init__(self):
        from jax import monitoring

        self.out: dict[str, dict] = {}
        self.current: str | None = None  # the phase sampling calls are attributed to
        self.compile = 0.0

        def listen(event: str, duration: float, **_):
            if event.startswith("/jax/core/compile/"):
                self.compile += duration

        monitoring.register_event_duration_secs_listener(listen)

    def __call__(self, name: str):
        phases = self

        class _Phase:
            def __enter__(self):
                note(f"{name} ...")
                self.t, self.c = time.perf_counter(), phases.compile
                return self

            def __exit__(self, *exc):
                phases.out[name] = {
                    "seconds": time.perf_counter() - self.t,
                    "compile_seconds": phases.compile - self.c,
                    "peak_rss": peak_rss(),
                }

        return _Phase()


def run_config(work: Path, args) -> dict:
    """The MARS2 run: one problem per step, a tree of 4 nodes expanded in one generator round, so
    both policies sample at once and each updates on its own nodes (buffer threshold 1)."""

    def policy(name):
        shape = POLICIES[name]
        dtype = args.llama_dtype if name == "coder_llama" else args.dtype
        frozen = name == "coder_llama" and not args.llama_update
        return {
            "model": {
                "path": str(work / shape),
                "dtype": dtype,
                "param_dtype": dtype,
                "remat": "full" if args.remat else "none",
            },
            # a policy that never updates keeps no Adam moments (SGD has none)
            "optimizer": {"name": "sgd" if frozen else "adamw", "lr": 1e-6},
            "loss": {"type": "ppo", "agg_mode": "token-mean"},  # what the torch side computes
            # each policy gets 2 of the 4 nodes (seed 0): one update each; 10**6: never
            "buffer": {"threshold": 10**6 if frozen else 2},
            "micro_batch_size": 2,
            "chat": "on",
        }

    return {
        "name": "real",
        "run_dir": str(work / "run"),
        "seed": args.seed,
        "policies": {name: policy(name) for name in POLICIES},
        "agents": {
            "alice": {"policy": "coder_qwen", "role": "You write Python."},
            "bob": {
                "policy": "coder_llama",
                "role": "You fix Python.",
                "template": "{role}{problem}{feedback}",
            },
        },
        "data": {
            "source": {"kind": "synthetic", "n_train": 4, "n_eval": 1, "difficulty": 1},
            "batch_size": 1,
        },
        "sampler": {"max_new_tokens": args.max_new_tokens, "max_prompt_len": 512},
        "workflow": {"kind": "mars2", "agents": ["alice", "bob"], "max_nodes": 4, "expansions_per_round": 4},
        "sandbox": {"workers": 2},
        "train": {"steps": 1, "save_every": 1, "log_to": [], "progress": False},
    }


def trainer(work: Path, args):
    from marljax.train.config import config_from_dict
    from marljax.train.loop import Trainer

    return Trainer(config_from_dict(run_config(work, args), "bench_real"))


def digest(tree) -> str:
    """sha256 over a pytree's leaves (in tree order): equal parameters, equal digest."""
    import jax
    import numpy as np

    h = hashlib.sha256()
    for leaf in jax.tree.leaves(tree):
        h.update(np.ascontiguousarray(jax.device_get(leaf)).tobytes())
    return h.hexdigest()


def note(what: str) -> None:
    """Progress on stderr (the phase's log file), with the peak RSS so far."""
    print(
        f"[bench_real {time.strftime('%H:%M:%S')}] {what} (peak RSS {peak_rss() / GiB:.2f} GiB)",
        file=sys.stderr,
        flush=True,
    )


def emit(obj: dict) -> None:
    print("JSON:" + json.dumps(obj), flush=True)


# ----------------------------------------------------------------------------- child phases
def child_build(work: Path, args) -> dict:
    from marljax.testing.real_shapes import write_real_checkpoint

    out = {}
    for shape in POLICIES.values():
        t = time.perf_counter()
        overrides = {} if args.layers is None else {"num_hidden_layers": args.layers}
        dtype = args.llama_dtype if shape == POLICIES["coder_llama"] else args.dtype
        write_real_checkpoint(work / shape, shape, seed=1, dtype=dtype, **overrides)
        out[shape] = {"seconds": time.perf_counter() - t, "peak_rss": peak_rss()}
    return out


def child_train(work: Path, args) -> dict:
    import jax
    import numpy as np

    from marljax.train import memory

    phases = Phases()
    with phases("load"):
        tr = trainer(work, args)
    sampling, updates, captured, prompts = [], {}, {}, {}
    for name, pol in tr.policies.items():

        def generate(prompt_ids, *, n, seed, sampler, _orig=pol.sampler.generate, _name=name, **settings):
            note(f"sampling {_name}: {len(prompt_ids) * n} rows")
            prompts.setdefault(_name, list(prompt_ids[0]))  # what the sampler was given, markup included
            t = time.perf_counter()
            res = _orig(prompt_ids, n=n, seed=seed, sampler=sampler, **settings)
            sampling.append(
                {
                    "policy": _name,
                    "phase": phases.current,
                    "seconds": time.perf_counter() - t,
                    "rows": len(prompt_ids) * n,
                    "prompt_tokens": int(sum(len(p) for p in prompt_ids)),
                    "new_tokens": int(np.sum(res.lengths)),
                    "peak_rss_after": peak_rss(),
                }
            )
            return res

        def start_update(samples, _orig=pol.start_update, _pol=pol, _name=name):
            # one update at a time, each waited for: its own wall time and memory peak
            note(f"update {_name}: {len(samples)} samples")
            t = time.perf_counter()
            pending = _orig(samples)
            jax.block_until_ready(_pol.params)
            captured[_name] = samples
            completion_tokens = sum(len(c) for c in samples.completion_ids)
            updates[_name] = {
                "seconds": time.perf_counter() - t,
                "rows": len(samples),
                "tokens": int(sum(len(p) for p in samples.prompt_ids) + completion_tokens),
                "completion_tokens": int(completion_tokens),
                "peak_rss_after": peak_rss(),
            }
            return pending

        pol.sampler.generate, pol.start_update = generate, start_update
    phases.current = "step"
    with phases("step"):
        metrics = tr.train_step()
    phases.current = "eval"
    with phases("eval"):
        metrics.update(tr.evaluate())
    with phases("checkpoint"):
        tr.save()
        tr.checkpointer.wait()
    seq_len = tr.cfg.sampler.max_prompt_len + tr.cfg.sampler.max_new_tokens
    estimates = {n: memory.policy_estimate(p, seq_len) for n, p in tr.policies.items()}
    markup = {}
    for name, ids in prompts.items():
        shape = POLICIES[name]
        text = tr.policies[name].turns.tokenizer.decode(ids, skip_special_tokens=False)
        head, tail = MARKUP[shape]
        markup[name] = {
            "ok": text.startswith(head) and text.endswith(tail),
            "start": text[:80],
            "end": text[-60:],
        }
    tr.close()  # the sandbox's workers and the checkpointer; the checkpoint is complete
    with open(work / "qwen_samples.pkl", "wb") as f:  # the batch the compare phase times again
        pickle.dump(captured.get("coder_qwen", []), f)
    return {
        "phases": phases.out,
        "sampling": sampling,
        "updates": updates,
        "metrics": {k: v for k, v in metrics.items() if k.startswith(("time/", "eval/")) or "/version" in k},
        "estimates": {
            n: {
                "params": e.params,
                "optimizer": e.optimizer,
                "gradients": e.gradients,
                "state": e.state,
                "activations": e.activations,
                "compute_copy": e.compute_copy,
                "peak": e.peak,
                "kv_per_sequence": e.kv_per_sequence,
                "rows": e.rows,
                "seq_len": e.seq_len,
            }
            for n, e in estimates.items()
        },
        "digests": {n: digest(p.params) for n, p in tr.policies.items()},
        "versions": {n: p.version for n, p in tr.policies.items()},
        "markup": markup,
        "step": tr.step,
    }


def child_resume(work: Path, args) -> dict:
    import numpy as np
    import torch
    import transformers

    from marljax.models.decoder import forward

    phases = Phases()
    with phases("load"):
        tr = trainer(work, args)
    with phases("restore"):
        resumed = tr.restore()
    out = {
        "resumed": resumed,
        "step": tr.step,
        "digests": {n: digest(p.params) for n, p in tr.policies.items()},
        "versions": {n: p.version for n, p in tr.policies.items()},
        "export": {},
    }
    for p in tr.policies.values():  # export needs the parameters only: free the moments first
        p.opt_state = None
    ids = np.array([[5, 17, 42, 99, 7, 250, 3, 11]])
    for name, pol in tr.policies.items():
        dest = work / "export" / name
        with phases(f"export {name}"):
            pol.export(dest)
        with phases(f"reload {name} in transformers"):
            model = transformers.AutoModelForCausalLM.from_pretrained(str(dest), dtype=torch.float32).eval()
            tok = transformers.AutoTokenizer.from_pretrained(str(dest))
        with torch.no_grad():
            theirs = model(input_ids=torch.tensor(ids)).logits.float().numpy()
        del model
        # float32 compute on both sides from the same (exported) weights: the export itself is checked
        f32 = dataclasses.replace(pol.config, dtype="float32")
        ours = np.asarray(forward(pol.params, ids, config=f32)[0], np.float32)
        chat = tok.apply_chat_template(
            [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
        )
        head, tail = MARKUP[POLICIES[name]]
        out["export"][name] = {
            "max_abs_logit_diff": float(np.max(np.abs(theirs - ours))),
            "logit_scale": float(np.max(np.abs(ours))),
            "chat_template": chat,
            "chat_ok": chat.endswith(tail) and (head.split("system")[0] in chat),
        }
    out["phases"] = phases.out
    return out


def child_compare(work: Path, args) -> dict:
    """The Qwen policy's trainer step against transformers + torch on the samples of the train phase:
    `--side both` interleaves them in this process; `marljax` / `transformers` times one side."""
    import bench_train
    import jax
    import numpy as np
    from bench_common import interleaved

    from marljax.train.config import config_from_dict
    from marljax.train.policy import Policy

    with open(work / "qwen_samples.pkl", "rb") as f:
        samples = pickle.load(f)
    cfg = config_from_dict(run_config(work, args), "bench_real")
    # one micro-batch of exactly these rows, so neither side computes padding rows; no remat, as
    # the torch side keeps its activations too
    pcfg = cfg.policies["coder_qwen"]
    pcfg = pcfg.model_copy(
        update={"micro_batch_size": len(samples), "model": pcfg.model.model_copy(update={"remat": "none"})}
    )
    pol = Policy("coder_qwen", pcfg, norm_constant=float(args.max_new_tokens), seed=cfg.seed)
    batch = pol.learner.collate(samples)
    host = {k: np.asarray(v)[0] for k, v in jax.device_get(batch).items()}  # [rows, T]
    if not np.all(host["temperature"] == 1.0):
        raise AssertionError("the torch side assumes samples drawn at temperature 1")

    def marljax_step():
        params, opt_state, m = pol.learner._rl_update(pol.params, pol.state.opt_state, batch, None)
        pol.state = pol.state.replace(params=params, opt_state=opt_state)
        return {k: float(v) for k, v in jax.device_get(m).items()}

    calls = {}
    if args.side in ("both", "marljax"):
        calls["marljax"] = marljax_step
    if args.side != "marljax":
        if args.side == "transformers":
            del pol  # its parameters and moments: the torch side alone may need the memory
        # the same precision on both sides: parameters, compute and Adam moments in `--dtype`
        calls["transformers"] = bench_train.setup_torch(
            work / POLICIES["coder_qwen"], host, args.dtype, param_dtype=args.dtype
        )
    first = {lib: fn() for lib, fn in calls.items()}  # warm-up: compiles; same weights, same entropy
    res = interleaved(calls, args.repeats, warmup=0)
    rows, T = host["tokens"].shape
    return {
        "rows": rows,
        "seq_len": T,
        "tokens": rows * T,
        "real_tokens": int(host["attention_mask"].sum()),
        "loss_tokens": int(host["loss_mask"].sum()),
        "peak_rss": peak_rss(),
        **{
            lib: {"all_seconds": r["all_seconds"], "first_entropy": first[lib]["entropy"]}
            for lib, r in res.items()
        },
    }


def compare_summary(parts: list[dict]) -> dict:
    """Both sides' times (median and best of all timed calls) and their ratio, from one process that
    ran both or from processes that ran one side each."""
    import statistics

    out = {k: parts[0][k] for k in ("rows", "seq_len", "tokens", "real_tokens", "loss_tokens")}
    out["peak_rss"] = max(p["peak_rss"] for p in parts)
    out["processes"] = len(parts)
    out["wall_seconds"] = sum(p["wall_seconds"] for p in parts)
    for lib in ("marljax", "transformers"):
        times = [t for p in parts if lib in p for t in p[lib]["all_seconds"]]
        entropy = next(p[lib]["first_entropy"] for p in parts if lib in p)
        out[lib] = {"seconds": statistics.median(times), "best_seconds": min(times), "all_seconds": times}
        out[lib]["first_entropy"] = entropy
    a, b = out["marljax"]["first_entropy"], out["transformers"]["first_entropy"]
    out["entropy_rel_diff"] = abs(a - b) / abs(b)
    out["speedup"] = out["transformers"]["seconds"] / out["marljax"]["seconds"]
    out["speedup_best"] = out["transformers"]["best_seconds"] / out["marljax"]["best_seconds"]
    return out


CHILDREN = {"build": child_build, "train": child_train, "resume": child_resume, "compare": child_compare}


# ----------------------------------------------------------------------------- parent
def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return 0


def run_child(phase: str, work: Path, argv: list[str], max_rss: float, kill_after: bool = False) -> dict:
    """Run one phase in a child with host memory kept (as marljax's entry points do), watching its
    RSS; with `kill_after` the child is SIGKILLed as soon as it has reported (it waits for that)."""
    from marljax.host_memory import kept_env

    env = kept_env()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    log = open(work / f"{phase}.log", "w")  # noqa: SIM115 (closed below)
    t = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", phase, "--work", str(work), *argv],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env=env,
    )
    lines: list[str] = []  # stdout, read by a thread while this one watches the RSS
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    result, top = None, 0
    while result is None and proc.poll() is None:
        top = max(top, _rss(proc.pid))
        if top > max_rss:
            proc.kill()
            raise RuntimeError(f"{phase}: RSS {top / GiB:.1f} GiB over --max-rss-gib; killed")
        found = [ln for ln in list(lines) if ln.startswith("JSON:")]
        if found:
            result = json.loads(found[-1][5:])
        time.sleep(0.2)
    wall = time.perf_counter() - t
    if result is not None and kill_after:
        proc.send_signal(signal.SIGKILL)
    proc.wait()
    reader.join()
    log.close()
    if result is None:
        found = [ln for ln in lines if ln.startswith("JSON:")]
        if proc.returncode or not found:
            tail = (work / f"{phase}.log").read_text()[-3000:]
            raise RuntimeError(f"{phase} failed (exit {proc.returncode}):\n{tail}")
        result = json.loads(found[-1][5:])
    result["wall_seconds"], result["watched_peak_rss"] = wall, top
    result["killed"] = kill_after and proc.returncode == -signal.SIGKILL
    return result


def run(
    layers: int | None = None,
    max_new_tokens: int = 256,
    repeats: int = 2,
    seed: int = 0,
    work: Path | None = None,
    max_rss_gib: float = 21.0,
    dtype: str = "float32",
    remat: bool = False,
    phases: list[str] | None = None,
    llama_dtype: str | None = None,
    llama_update: bool = True,
    compare_apart: bool = False,
) -> dict:
    """All phases; returns the results and their markdown."""
    own = work is None
    tmp = tempfile.TemporaryDirectory(prefix="marljax-bench-real-") if own else None
    work = Path(tmp.name) if own else Path(work)
    work.mkdir(parents=True, exist_ok=True)
    argv = ["--max-new-tokens", str(max_new_tokens), "--repeats", str(repeats), "--seed", str(seed)]
    argv += ["--dtype", dtype, "--llama-dtype", llama_dtype or dtype] + (["--remat"] if remat else [])
    argv += [] if llama_update else ["--no-llama-update"]
    argv += [] if layers is None else ["--layers", str(layers)]
    limit = max_rss_gib * GiB
    try:
        out = {"layers": layers, "max_new_tokens": max_new_tokens, "repeats": repeats, "dtype": dtype}
        out.update(remat=remat, llama_dtype=llama_dtype or dtype, llama_update=llama_update)
        out["compare_apart"] = compare_apart
        for phase in phases or CHILDREN:
            if phase != "compare":
                out[phase] = run_child(phase, work, argv, limit, kill_after=phase == "train")
            elif not compare_apart:
                out[phase] = compare_summary([run_child(phase, work, argv + ["--side", "both"], limit)])
            else:  # one side per process, alternating (A B A B): the two do not fit in one
                argv1 = argv + ["--repeats", "1"]
                parts = [
                    run_child(phase, work, argv1 + ["--side", side], limit)
                    for _ in range(repeats)
                    for side in ("marljax", "transformers")
                ]
                out[phase] = compare_summary(parts)
            (work / f"{phase}.json").write_text(json.dumps(out[phase]))  # a long run keeps what it has
    finally:
        if own:
            tmp.cleanup()
    for phase in CHILDREN:  # phases run earlier into the same --work
        if phase not in out and (work / f"{phase}.json").is_file():
            out[phase] = json.loads((work / f"{phase}.json").read_text())
    if all(p in out for p in CHILDREN):
        out["markdown"] = markdown(out)
    return out


def memory_summary(tr: dict) -> dict:
    """The train process's estimate from `marljax.train.memory`'s terms: what stays resident (both
    policies' parameters and moments) plus the larger of one update (gradients, activations,
    compute-dtype copies) and one sampling call (KV cache, the prefill's and the decode's
    compute-dtype copies of the weights)."""
    est = tr["estimates"]
    resident = sum(e["params"] + e["optimizer"] for e in est.values())
    update = max(  # the policies that updated in the step
        [est[n]["gradients"] + est[n]["activations"] + est[n]["compute_copy"] for n in tr["updates"]] or [0]
    )
    kv = max(
        est[s["policy"]]["kv_per_sequence"] * s["rows"] + est[s["policy"]]["compute_copy"]
        for s in tr["sampling"]
    )
    return {
        "logged": sum(e["peak"] for e in est.values()),
        "resident": resident,
        "update": update,
        "kv": kv,
        "estimate": resident + max(update, kv),
        "measured": max(p["peak_rss"] for p in tr["phases"].values()),
    }


def _g(x: float) -> str:
    return f"{x / GiB:.2f}"


def markdown(r: dict) -> str:
    tr, cmp, res = r["train"], r["compare"], r["resume"]
    depth = "real depth" if r["layers"] is None else f"{r['layers']} layers"
    lines = [
        f"Shapes: Qwen2.5-0.5B ({r['dtype']}) and Llama-3.2-1B ({r['llama_dtype']}"
        f"{'' if r['llama_update'] else ', sampling only: no update'}), {depth}"
        f"{', layers rematerialised in the step' if r.get('remat') else ''}; "
        f"max_new_tokens {r['max_new_tokens']}.\n",
        "| phase | process | wall s | of which XLA compile s | peak RSS GiB (so far) |",
        "|---|---|---|---|---|",
    ]
    for shape, b in r["build"].items():
        if isinstance(b, dict) and "seconds" in b:
            lines.append(f"| build {shape} | build | {b['seconds']:.1f} | - | {_g(b['peak_rss'])} |")
    for proc in ("train", "resume"):
        for name, p in r[proc]["phases"].items():
            lines.append(
                f"| {name} | {proc} | {p['seconds']:.1f} | {p['compile_seconds']:.1f} | {_g(p['peak_rss'])} |"
            )
    lines.append(
        f"| update qwen x{r['repeats']} vs torch | compare | {cmp['wall_seconds']:.1f} | - | {_g(cmp['peak_rss'])} |"
    )
    lines += [
        "",
        "| sampling | phase | rows | prompt tokens | new tokens | s | new tokens/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in tr["sampling"]:
        lines.append(
            f"| {s['policy']} | {s['phase']} | {s['rows']} | {s['prompt_tokens']} | {s['new_tokens']} "
            f"| {s['seconds']:.1f} | {s['new_tokens'] / s['seconds']:.1f} |"
        )
    lines += [
        "",
        "| update (in the step, compile included) | rows | tokens | s | tokens/s |",
        "|---|---|---|---|---|",
    ]
    for n, u in tr["updates"].items():
        lines.append(
            f"| {n} | {u['rows']} | {u['tokens']} | {u['seconds']:.1f} | {u['tokens'] / u['seconds']:.1f} |"
        )
    est, m = tr["estimates"], memory_summary(tr)
    lines += [
        "",
        f"Memory (train process): the logged estimates sum to {_g(m['logged'])} GiB ("
        + ", ".join(f"{n} {_g(e['peak'])}" for n, e in est.items())
        + f"); both policies' parameters and moments {_g(m['resident'])} GiB + the larger update's "
        f"gradients, activations and compute-dtype copies {_g(m['update'])} GiB (sampling: {_g(m['kv'])} "
        f"GiB) = {_g(m['estimate'])} GiB; measured peak RSS "
        f"{_g(m['measured'])} GiB ({100 * (m['measured'] / m['estimate'] - 1):+.0f}%).",
        "",
        f"Update of the Qwen shape on the step's {cmp['rows']} samples ({cmp['rows']} x {cmp['seq_len']} tokens, "
        f"{cmp['real_tokens']} real): marljax {cmp['marljax']['seconds']:.1f} s, transformers + torch "
        f"{cmp['transformers']['seconds']:.1f} s: **{cmp['speedup']:.2f}x** (best of each "
        f"{cmp['speedup_best']:.2f}x; median of {r['repeats']} "
        + ("calls, one side per process, alternating" if cmp["processes"] > 1 else "interleaved calls")
        + f"; entropy rel. diff {cmp['entropy_rel_diff']:.1e}); marljax "
        f"{cmp['tokens'] / cmp['marljax']['seconds']:.1f} tokens/s.",
        "",
        f"Kill and resume: train process killed by SIGKILL: {tr['killed']}; resumed at step {res['step']}, "
        f"parameters equal: {res['digests'] == tr['digests']}. Export: "
        + ", ".join(
            f"{n} max |logit diff| {e['max_abs_logit_diff']:.1e} (of {e['logit_scale']:.2f})"
            for n, e in res["export"].items()
        )
        + ". Chat markup: "
        + ", ".join(f"{n} {m['ok']}" for n, m in tr["markup"].items())
        + ".",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, help="fewer layers than the real models (real vocab and width)")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=2, help="timed update calls per side")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="parameters, compute and moments of both policies (bfloat16 fits the full depth in 24 GiB)",
    )
    ap.add_argument(
        "--llama-dtype", choices=["float32", "bfloat16"], help="the Llama policy's (default: --dtype)"
    )
    ap.add_argument(
        "--no-llama-update",
        dest="llama_update",
        action="store_false",
        help="the Llama policy samples but does not update (its buffer never fills; SGD, so no moments)",
    )
    ap.add_argument(
        "--compare-apart",
        action="store_true",
        help="time the two sides of the update comparison in alternating processes (they do not fit in one)",
    )
    ap.add_argument(
        "--side", choices=["both", "marljax", "transformers"], default="both", help=argparse.SUPPRESS
    )
    ap.add_argument("--remat", action="store_true", help="rematerialise the layers in the updates")
    ap.add_argument(
        "--phases",
        nargs="+",
        choices=list(CHILDREN),
        help="run only these (the others' files must be in --work)",
    )
    ap.add_argument("--max-rss-gib", type=float, default=21.0, help="kill a phase above this RSS")
    ap.add_argument("--out", type=Path, help="write results_real.json / .md here")
    ap.add_argument("--work", type=Path, help="keep checkpoints and logs here (default: a temporary dir)")
    ap.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.llama_dtype is None:
        args.llama_dtype = args.dtype
    if args.child:
        result = CHILDREN[args.child](args.work, args)
        emit(result)
        if args.child == "train":  # wait to be killed: the resume must not rely on a clean exit
            time.sleep(3600)
        return
    out = run(
        args.layers,
        args.max_new_tokens,
        args.repeats,
        args.seed,
        args.work,
        args.max_rss_gib,
        args.dtype,
        args.remat,
        args.phases,
        args.llama_dtype,
        args.llama_update,
        args.compare_apart,
    )
    print(out.get("markdown") or json.dumps(out, indent=1))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results_real.md").write_text(out["markdown"] + "\n")
        (args.out / "results_real.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
