"""Supervised fine-tuning on reference solutions: a warm start for RL, on the same machinery.

A problem's reference answer (`solution` of synthetic / stdio rows, `code` of
MBPP, `canonical_solution` of HumanEval, `answer` of math) becomes the target
completion of every agent's prompt for it; each policy takes one optimiser
step per SFT step on its agents' pairs. Afterwards each policy's optimiser
state and step count are reset (RL starts its schedule afresh) and its KL
reference becomes the fine-tuned model.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from marljax.train.metrics import Progress
from marljax.workflows.base import Agent
from marljax.workflows.types import Rows

log = logging.getLogger(__name__)


def reference_completion(problem: Any) -> str | None:
    """The target text for `problem`, formatted as a model should answer; None without one."""
    f = problem.fields
    if problem.schema == "math":
        return f"The answer is \\boxed{{{problem.answer}}}."
    code = f.get("solution") or f.get("code")
    if code is None and problem.schema == "humaneval" and f.get("canonical_solution"):
        code = problem.prompt + f["canonical_solution"]
    return None if code is None else f"```python\n{code.rstrip()}\n```"


def sft_samples(
    problems: Sequence[Any],
    agent: Agent,
    policy: Any,
    target: Callable[[Any], str | None] = reference_completion,
) -> Rows:
    """(prompt, target + eos) pairs of `agent` for the problems that have a target."""
    pairs = [(agent.render(p.prompt), target(p)) for p in problems]
    return pair_samples([(q, t) for q, t in pairs if t is not None], agent, policy)


def pair_samples(pairs: Sequence[tuple[str, str]], agent: Agent, policy: Any) -> Rows:
    """SFT rows of `agent` from (prompt, target text) pairs, the prompt encoded as the sampler gets
    it (chat template or raw text); the target ends with the first EOS id (a chat turn's end)."""
    completions = [policy.turns.encode_completion(target) for _, target in pairs]
    return Rows(
        [policy.turns.encode_prompt(prompt) for prompt, _ in pairs],
        completions,
        [np.zeros(len(c), np.float32) for c in completions],
        agent=agent.name,
        policy=agent.policy,
    )


def warn_cut_targets(trainer: Any, problems: Sequence[Any], target: Callable[[Any], str | None]) -> int:
    """Warn, per agent, when SFT targets are longer than the agent's sampling budget: RL then cuts
    every such completion (and the overlong penalty, where set, punishes the style SFT taught).
    Returns how many (agent, target) pairs are too long."""
    too_long, lengths_of = 0, {}  # agents on one policy share its tokenizer: encode once per policy
    for agent in trainer.agents.values():
        if agent.policy not in lengths_of:
            turns = trainer.policies[agent.policy].turns
            lengths_of[agent.policy] = [len(turns.encode_completion(target(p))) for p in problems]
        lengths = lengths_of[agent.policy]
        budget = trainer.cfg.agent_sampling(agent.name).max_new_tokens
        over = sum(n > budget for n in lengths)
        if over:
            log.warning(
                "SFT: %d of %d reference targets of agent %s are longer than its max_new_tokens=%d "
                "(the longest %d tokens): RL will cut every such completion; raise sampler.max_new_tokens "
                "or agents.%s.sampling.max_new_tokens",
                over,
                len(lengths),
                agent.name,
                budget,
                max(lengths),
                agent.name,
            )
        too_long += over
    return too_long


def run_sft(
    trainer: Any,
    steps: int,
    writer: Any,
    desc: str = "sft",
    extra: Mapping[str, Sequence[tuple[str, str]]] | None = None,
    extra_every: int = 8,
    target: Callable[[Any], str | None] = reference_completion,
) -> None:
    """`steps` SFT steps over the trainer's train problems (batch by batch, cycling).

    `target` gives a problem's answer text (default: its reference solution;
    the demo passes a sloppy teacher's). `extra` maps an agent to more
    (prompt text, target) pairs, e.g. refinement prompts; every
    `extra_every`-th step trains on a batch of those instead (separate
    batches, so long extra prompts do not pad the short ones).
    """
    extra = {a: pairs for a, pairs in (extra or {}).items() if pairs}
    problems = [p for p in trainer.train_problems if target(p) is not None]
    if not problems:
        raise ValueError("train.sft_steps > 0 but no training problem has a reference solution")
    warn_cut_targets(trainer, problems, target)
    batch = trainer.cfg.data.batch_size
    bar = Progress(steps, desc=desc, enabled=None if trainer.cfg.train.progress else False)
    for k in range(steps):
        use_extra, n = extra and k % extra_every == extra_every - 1, k // extra_every
        chosen = [problems[(k * batch + j) % len(problems)] for j in range(batch)]
        metrics = {}
        for name, policy in trainer.policies.items():
            parts = []
            for a in trainer.agents.values():
                if a.policy != name:
                    continue
                if not use_extra:
                    parts.append(sft_samples(chosen, a, policy, target))
                elif a.name in extra:
                    pairs = extra[a.name]
                    parts.append(
                        pair_samples([pairs[(n * batch + j) % len(pairs)] for j in range(batch)], a, policy)
                    )
            rows = Rows.concatenate(parts)
            if len(rows):
                m = policy.sft_update(rows, trainer.cfg.train.sft_lr)
                metrics.update({f"sft/{name}/{key}": v for key, v in m.items()})
        writer.write(k - steps, metrics)  # negative steps: SFT comes before RL step 0
        bar.update(1, **{key.split("/")[1]: v for key, v in metrics.items() if key.endswith("/loss")})
    bar.close()
    for policy in trainer.policies.values():
        policy.reset_optimizer()
        policy.reset_reference()
