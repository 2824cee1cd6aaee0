"""Supervised fine-tuning: a warm start for RL, on the same machinery.

Its examples are either the problems' reference answers (`solution` of
synthetic / stdio rows, `code` of MBPP, `canonical_solution` of HumanEval,
`answer` of math), each the target completion of every agent's prompt for it,
or a scripted teacher's turns (`train.sft_teacher`): the teacher plays every
agent of the workflow itself, so multi-turn and tool workflows get the very
prompts their agents will meet. Each policy takes one optimiser step per SFT
step on its agents' examples, with the policy's optimiser changed by the
`train.sft_*` settings. Afterwards each policy's optimiser state and step
count are reset (RL starts its schedule afresh) and its KL reference becomes
the fine-tuned model.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from marljax.train.config import OptimizerConfig, TrainConfig
from marljax.train.metrics import Progress
from marljax.workflows.base import Agent, ScriptedGenerator
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


def demonstrations(
    cfg: Any,
    script,
    rounds: int,
    seed: int = 0,
    policies: Mapping[str, Any] | None = None,
    verifier: Any = None,
) -> dict[str, list[tuple[str, str]]]:
    """(prompt, reply) pairs per agent from `rounds` rollouts of the run config's workflow with the
    teacher `script` playing every agent, over its train problems batch by batch. Without `policies`
    (name -> its `TurnFormat`, `Policy.turns`) no model is needed, but a prompt continuing an earlier
    turn of an agent holds that turn's bytes, not tokens: only its text is of use (a tokenizer's
    corpus). With them, every prompt encodes as the policy will see it when it samples the same
    turns (the earlier turns' tokens, each ending with an end-of-turn token), which SFT needs.
    `verifier`: for workflows whose prompts carry test feedback (code teams: the trainer's)."""
    from marljax.workflows.base import build_workflow

    agents = {n: Agent(n, a.policy, a.role, a.template) for n, a in sorted(cfg.agents.items())}
    pairs: dict[str, list[tuple[str, str]]] = {a: [] for a in agents}

    def record(agent: Agent, prompt: str, k: int, s: int) -> str:
        reply = script(agent, prompt, k, s)
        pairs[agent.name].append((prompt, reply))
        return reply

    workflow, gen = build_workflow(cfg.workflow), ScriptedGenerator(record, policies=policies)
    problems, batch = cfg.data.source.split("train"), cfg.data.batch_size
    for r in range(rounds):
        chosen = [problems[(r * batch + j) % len(problems)] for j in range(batch)]
        workflow.rollout(chosen, agents, gen, verifier, seed + r)
    return pairs


def pair_batches(
    pairs: Sequence[tuple[Agent, tuple[str, str]]], steps: int, batch: int, seed: str
) -> list[list[tuple[Agent, tuple[str, str]]]]:
    """`steps` batches of `batch` (agent, (prompt, reply)) examples, cycling through `pairs` in a
    shuffled order (from `seed`). Each batch holds examples of similar length: a batch is padded to
    its longest, and a few long multi-turn prompts would otherwise put most batches in twice the
    length bucket."""
    if len(pairs) < batch:
        raise ValueError(f"SFT: {len(pairs)} examples, fewer than a batch of {batch}")
    mine, rng = list(pairs), random.Random(seed)
    batches: list[list] = []
    while len(batches) < steps:
        rng.shuffle(mine)
        for w in range(0, len(mine), 8 * batch):  # sort windows of 8 batches by length
            window = sorted(mine[w : w + 8 * batch], key=lambda ap: len(ap[1][0]) + len(ap[1][1]))
            chunk = [window[j : j + batch] for j in range(0, len(window), batch)]
            rng.shuffle(chunk)
            batches += [c for c in chunk if len(c) == batch]
    return batches[:steps]


def sft_optimizer(policy: OptimizerConfig, train: TrainConfig, steps: int) -> OptimizerConfig | None:
    """The policy's optimiser with what `train.sft_*` sets changed (None: it is the policy's)."""
    change: dict[str, Any] = {}
    if train.sft_lr is not None:
        change["lr"] = train.sft_lr
    if train.sft_warmup_steps is not None:
        change["warmup_steps"] = train.sft_warmup_steps
    if train.sft_schedule is not None:
        change.update(schedule=train.sft_schedule, decay_steps=max(steps, 1))
    if train.sft_min_lr_ratio is not None:
        change["min_lr_ratio"] = train.sft_min_lr_ratio
    return policy.model_copy(update=change) if change else None


def warn_cut_targets(
    trainer: Any, targets: Mapping[str, Sequence[str]], what: str = "reference targets"
) -> int:
    """Warn, per agent, when its SFT targets (`targets`: agent -> texts) are longer than the agent's
    sampling budget: RL then cuts every such completion (and the overlong penalty, where set,
    punishes the style SFT taught). Returns how many (agent, target) pairs are too long."""
    too_long, lengths_of = 0, {}  # agents of one policy often share their targets: encode them once
    for name, texts in targets.items():
        agent = trainer.agents[name]
        key = (agent.policy, tuple(texts))
        if key not in lengths_of:
            turns = trainer.policies[agent.policy].turns
            lengths_of[key] = [len(turns.encode_completion(t)) for t in texts]
        lengths = lengths_of[key]
        budget = trainer.cfg.agent_sampling(name).max_new_tokens
        over = sum(n > budget for n in lengths)
        if over:
            log.warning(
                "SFT: %d of %d %s of agent %s are longer than its max_new_tokens=%d (the longest %d "
                "tokens): RL will cut every such completion; raise sampler.max_new_tokens or "
                "agents.%s.sampling.max_new_tokens",
                over,
                len(lengths),
                what,
                name,
                budget,
                max(lengths),
                name,
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
    """`steps` SFT steps: on the trainer's train problems (batch by batch, cycling) or, with
    `train.sft_teacher`, on its teacher's turns (`teacher_examples`).

    `target` gives a problem's answer text (default: its reference solution;
    the demo passes a sloppy teacher's). `extra` maps an agent to more
    (prompt text, target) pairs, e.g. refinement prompts; every
    `extra_every`-th step trains on a batch of those instead (separate
    batches, so long extra prompts do not pad the short ones).
    """
    t = trainer.cfg.train
    batch = t.sft_batch_size or trainer.cfg.data.batch_size
    if t.sft_teacher is not None:
        if extra:
            raise ValueError("run_sft: extra examples go with reference targets, not with train.sft_teacher")
        examples = teacher_examples(trainer, steps, batch)
    else:
        examples = reference_examples(trainer, steps, batch, extra or {}, extra_every, target)
    optimizers = {
        name: sft_optimizer(p.learner.optimizer_cfg, t, steps) for name, p in trainer.policies.items()
    }
    bar = Progress(steps, desc=desc, enabled=None if t.progress else False)
    for k in range(steps):
        metrics = {}
        for name, policy in trainer.policies.items():
            rows = examples(k, name)
            if rows is not None and len(rows):
                m = policy.sft_update(rows, optimizers[name])
                metrics.update({f"sft/{name}/{key}": v for key, v in m.items()})
        writer.write(k - steps, metrics)  # negative steps: SFT comes before RL step 0
        bar.update(1, **{key.split("/")[1]: v for key, v in metrics.items() if key.endswith("/loss")})
    bar.close()
    for policy in trainer.policies.values():
        policy.reset_optimizer()
        policy.reset_reference()


def reference_examples(
    trainer: Any,
    steps: int,
    batch: int,
    extra: Mapping[str, Sequence[tuple[str, str]]],
    extra_every: int,
    target: Callable[[Any], str | None],
) -> Callable[[int, str], Rows | None]:
    """(SFT step, policy) -> its rows: its agents' prompts for the step's batch of train problems
    with their `target`s, or every `extra_every`-th step a batch of `extra` pairs (`run_sft`)."""
    extra = {a: pairs for a, pairs in extra.items() if pairs}
    # (problem, its target text) for the problems that have one; a target is computed once
    targeted = [(p, text) for p in trainer.train_problems if (text := target(p)) is not None]
    if not targeted:
        raise ValueError("train.sft_steps > 0 but no training problem has a reference solution")
    texts = [text for _, text in targeted]
    warn_cut_targets(trainer, {a: texts for a in trainer.agents})

    def examples(k: int, name: str) -> Rows | None:
        use_extra, n = extra and k % extra_every == extra_every - 1, k // extra_every
        chosen = [targeted[(k * batch + j) % len(targeted)] for j in range(batch)]
        policy, parts = trainer.policies[name], []
        for a in trainer.agents.values():
            if a.policy != name:
                continue
            if not use_extra:
                parts.append(pair_samples([(a.render(p.prompt), text) for p, text in chosen], a, policy))
            elif a.name in extra:
                pairs = extra[a.name]
                parts.append(
                    pair_samples([pairs[(n * batch + j) % len(pairs)] for j in range(batch)], a, policy)
                )
        return Rows.concatenate(parts) if parts else None

    return examples


def teacher_examples(trainer: Any, steps: int, batch: int) -> Callable[[int, str], Rows | None]:
    """(SFT step, policy) -> its rows: a batch of its agents' (prompt, reply) turns that
    `train.sft_teacher` played over `rounds` rollouts of the workflow (`demonstrations`, prompts as
    the policy will see them), in `pair_batches`' order."""
    cfg, teacher = trainer.cfg, trainer.cfg.train.sft_teacher
    script = teacher.make_script(cfg.seed)
    turns = {n: p.turns for n, p in trainer.policies.items()}
    pairs = demonstrations(cfg, script, teacher.rounds, cfg.seed, turns, trainer.verifier)
    warn_cut_targets(trainer, {a: [reply for _, reply in ps] for a, ps in pairs.items()}, "teacher replies")
    batches = {}
    for name in trainer.policies:
        mine = [(a, p) for a in trainer.agents.values() if a.policy == name for p in pairs.get(a.name, ())]
        if not mine:
            raise ValueError(f"train.sft_teacher: {teacher.script} played no turn of policy {name}'s agents")
        # the seed string of the tool warm starts measured in benchmarks/RESULTS.md, kept so they reproduce
        batches[name] = pair_batches(mine, steps, batch, f"marljax-tool-sft:{name}")

    def examples(k: int, name: str) -> Rows:
        policy = trainer.policies[name]
        return Rows.concatenate([pair_samples([p], a, policy) for a, p in batches[name][k]])

    return examples
