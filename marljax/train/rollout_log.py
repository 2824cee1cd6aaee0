"""Rollout logs: what the policies were shown and what they wrote, one JSONL file per logged step.

With `train.log_rollouts: N` every N-th step writes ``RUN_DIR/rollouts/step_<step>.jsonl``,
one JSON object per completion of that step's rollout::

    {"step": 10, "agent": "solver", "policy": "main", "version": 9,
     "problem": "q3", "episode": 0, "node": 1, "parent": -1, "depth": 0, "turn": 0,
     "reward": 1.0, "advantage": 1.5, "passed": 1.0, "finish_reason": "eos",
     "temperature": 1.0, "prompt_len": 12, "completion_len": 9,
     "prompt": "Question 3: answer 7", "completion": " 7<|im_end|>"}

The id keys are the workflow's `ID_FIELDS` for that completion. A multi-turn sequence (an agent's
tool calls, the tool results and its later turns as one completion, `merge_turns`) also has
``trained_len``: the completion tokens the agent wrote, which alone are trained. `prompt` and
`completion` decode the token ids with special tokens kept, so chat markup and
end-of-sequence tokens show exactly as the model saw and wrote them. Token ids
are left out: the texts and lengths are what a reader needs, and ids would make
the lines several times longer.

Only process 0 writes, as for the metrics: on several hosts the file holds
that process's share of the batch.

A file is written to a temporary name and renamed, so a step's file is either
absent or complete. A run that starts or resumes at step s first deletes the
files of later steps: it will redo those steps, and a later step it does not
log must not keep the old run's file.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from marljax.train.files import write_atomically
from marljax.workflows.types import Rollout

ROLLOUTS_DIR = "rollouts"
_FILE_RE = re.compile(r"step_(\d+)\.jsonl")
# control characters other than newline and tab, which a sampled completion can hold and a terminal
# would act on (an escape sequence could hide the text that follows)
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def step_path(run_dir: str | os.PathLike, step: int) -> Path:
    return Path(run_dir) / ROLLOUTS_DIR / f"step_{int(step):06d}.jsonl"


def rollout_records(step: int, rollout: Rollout, tokenizers: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One record per completion of `rollout`; `tokenizers` maps each policy name to its tokenizer."""
    records = []
    prompts: dict[tuple[str, bytes], str] = {}  # a group shares its prompt: decode it once
    for i, g in enumerate(rollout.generations):
        tok = tokenizers[g.policy]
        key = (g.policy, np.asarray(g.prompt_ids).tobytes())
        if key not in prompts:
            prompts[key] = tok.decode(g.prompt_ids, skip_special_tokens=False)
        records.append(
            {
                "step": int(step),
                "agent": g.agent,
                "policy": g.policy,
                "version": int(g.version),
                **{k: _plain(v) for k, v in rollout.ids[i].items()},
                "reward": float(rollout.rewards[i]),
                "advantage": float(rollout.advantages[i]),
                "passed": float(rollout.passed[i]),
                "finish_reason": g.finish_reason,
                "temperature": float(g.temperature),
                "prompt_len": len(g.prompt_ids),
                "completion_len": len(g.completion_ids),
                "prompt": prompts[key],
                "completion": tok.decode(g.completion_ids, skip_special_tokens=False),
            }
        )
        if g.completion_mask is not None:  # a multi-turn sequence: tool results between the turns
            records[-1]["trained_len"] = int(g.completion_mask.sum())
    return records


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def write_step(run_dir: str | os.PathLike, step: int, records: list[dict[str, Any]]) -> Path:
    """Write one step's records atomically (a crash leaves no file or the whole file)."""
    path = step_path(run_dir, step)
    write_atomically(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    return path


def logged_steps(run_dir: str | os.PathLike) -> list[int]:
    """Steps with a rollout file, ascending."""
    folder = Path(run_dir) / ROLLOUTS_DIR
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := _FILE_RE.fullmatch(p.name)))


def prune_after(run_dir: str | os.PathLike, step: int) -> None:
    """Delete the files of steps after `step` and any temporary file a crash left behind."""
    folder = Path(run_dir) / ROLLOUTS_DIR
    if not folder.is_dir():
        return
    for p in folder.iterdir():
        m = _FILE_RE.fullmatch(p.name)
        if p.name.endswith(".tmp") or (m and int(m.group(1)) > step):
            p.unlink()


def read_step(run_dir: str | os.PathLike, step: int) -> list[dict[str, Any]]:
    path = step_path(run_dir, step)
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# ------------------------------------------------------------------ viewer
def format_step(
    records: list[dict[str, Any]], *, agent: str | None = None, limit: int | None = None
) -> Iterator[str]:
    """Lines of a readable listing, grouped by problem; a prompt is shown once per run of samples
    that share it (a group's samples all do)."""
    shown = [r for r in records if agent is None or r["agent"] == agent]
    total = len(shown)
    shown = shown[:limit] if limit is not None else shown
    by_problem: dict[str, list[dict[str, Any]]] = {}
    for r in shown:
        by_problem.setdefault(str(r.get("problem")), []).append(r)
    step = records[0]["step"] if records else "?"
    yield f"step {step}: {total} samples" + (f", showing {len(shown)}" if len(shown) < total else "")
    for problem, group in by_problem.items():
        rewards = [r["reward"] for r in group]
        yield ""
        yield f"=== problem {problem}: {len(group)} samples, mean reward {np.mean(rewards):.3g} ==="
        last_prompt = None
        for r in group:
            if r["prompt"] != last_prompt:
                yield f"--- prompt ({r['prompt_len']} tokens) ---"
                yield printable(r["prompt"])
                last_prompt = r["prompt"]
            where = " ".join(f"{k} {r[k]}" for k in ("episode", "node", "parent", "turn") if k in r)
            yield (
                f"--- {r['agent']} (policy {r['policy']} v{r['version']}) {where} | "
                f"reward {r['reward']:.4g} advantage {r['advantage']:.4g} passed {r['passed']:.3g} | "
                f"{r['finish_reason']}, {r['completion_len']} tokens ---"
            )
            yield printable(r["completion"])


def printable(text: str) -> str:
    """`text` with control characters other than newline and tab written as `\\xNN`."""
    return _CONTROL_RE.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
