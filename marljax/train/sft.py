"""Supervised fine-tuning on reference solutions: a warm start for RL, on the same machinery.

A problem's reference answer (`solution` of synthetic / stdio rows, `code` of
MBPP, `canonical_solution` of HumanEval, `answer` of math) becomes the target
completion of every agent's prompt for it; each policy takes one optimiser
step per SFT step on its agents' pairs. Afterwards each policy's optimiser
state and step count are reset (RL starts its schedule afresh) and its KL
reference becomes the fine-tuned model.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from marljax.workflows.base import Agent
from marljax.workflows.types import Sample


def reference_completion(problem: Any) -> str | None:
    """The target text for `problem`, formatted as a model should answer; None without one."""
    f = problem.fields
    if problem.schema == "math":
        return f"The answer is \\boxed{{{problem.answer}}}."
    code = f.get("solution") or f.get("code")
    if code is None and problem.schema == "humaneval" and f.get("canonical_solution"):
        code = problem.prompt + f["canonical_solution"]
    return None if code is None else f"```python\n{code.rstrip()}\n```"


def sft_samples(problems: Sequence[Any], agent: Agent, policy: Any) -> list[Sample]:
    """(prompt, reference + eos) pairs of `agent` for the problems that have a reference."""
    tok, out = policy.tokenizer, []
    for p in problems:
        target = reference_completion(p)
        if target is None:
            continue
        prompt = tok(agent.render(p.prompt))["input_ids"]
        completion = tok(target)["input_ids"] + policy.eos_ids[:1]
        out.append(Sample(prompt, completion, np.zeros(len(completion), np.float32), reward=0.0,
                          agent=agent.name, policy=agent.policy, ids={"problem": p.id}))
    return out


def run_sft(trainer: Any, steps: int, writer: Any) -> None:
    """`steps` SFT steps over the trainer's train problems (batch by batch, cycling)."""
    problems = [p for p in trainer.train_problems if reference_completion(p) is not None]
    if not problems:
        raise ValueError("train.sft_steps > 0 but no training problem has a reference solution")
    batch = trainer.cfg.data.batch_size
    for k in range(steps):
        chosen = [problems[(k * batch + j) % len(problems)] for j in range(batch)]
        metrics = {}
        for name, policy in trainer.policies.items():
            samples = [s for a in trainer.agents.values() if a.policy == name
                       for s in sft_samples(chosen, a, policy)]
            if samples:
                m = policy.sft_update(samples)
                metrics.update({f"sft/{name}/{key}": v for key, v in m.items()})
        writer.write(k - steps, metrics)  # negative steps: SFT comes before RL step 0
    for policy in trainer.policies.values():
        policy.opt_state = policy.optimizer.init(policy.params)
        policy.step = 0
        policy.reset_reference()
