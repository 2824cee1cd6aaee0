"""The small protocol between workflows, agents and whatever generates text.

A workflow sees agents (name, role, template, policy name) and a `Generator`:
`generate(requests, n, seed)` takes `(agent, prompt_text)` pairs and returns
`n` generations for each. `PolicyGenerator` sends all requests of one policy
to the sampler as one batch (across problems, trees and agents sharing the
policy); tests drive the same workflows with a `ScriptedGenerator`.
"""

from __future__ import annotations

import dataclasses
import string
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np

from marljax.settings import StrictModel
from marljax.workflows.types import Sample

PLACEHOLDERS = ("role", "problem", "feedback", "history")


class WorkflowSettings(StrictModel):
    """Base of each workflow's typed options (`kind` names the workflow in YAML)."""

    kind: str

    def check_agents(self, agents: Mapping[str, Any]) -> list[tuple[tuple[str, ...], str, Any]]:
        """Cross-checks against the run's agents: `(key under workflow, problem, value)` each.
        By default an `agent` option, if the workflow has one, must name an agent."""
        name = getattr(self, "agent", None)
        if name is not None and name not in agents:
            return [(("agent",), f"unknown agent; known: {', '.join(agents)}", name)]
        return []


@dataclasses.dataclass(frozen=True)
class Agent:
    """A logical agent: its name, the policy it acts with and how it phrases its prompt."""

    name: str
    policy: str
    role: str = ""
    template: str = "{role}{problem}"

    def render(self, problem: str, feedback: str = "", history: str = "") -> str:
        return self.template.format(role=self.role, problem=problem, feedback=feedback, history=history)

    def render_in_context(self, problem: str, feedback: str = "", history: str = "") -> str:
        """`render`, with the history and feedback appended to the problem text (in that order)
        when the template has no place for them (the default `{role}{problem}` has none)."""
        used = set(template_fields(self.template))
        extra = [text for name, text in (("history", history), ("feedback", feedback)) if text and name not in used]
        return self.render("\n\n".join([problem, *extra]), feedback=feedback, history=history)


def template_fields(template: str) -> list[str]:
    """Placeholder names used by a format string (raises ValueError when malformed)."""
    return [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]


@dataclasses.dataclass(frozen=True)
class Generation:
    """One sampled completion: its text, token ids and the sampler's log-probs."""

    text: str
    prompt_ids: np.ndarray
    completion_ids: np.ndarray
    logprobs: np.ndarray
    finish_reason: str = "stop"

    def sample(self, agent: Agent, reward: float, advantage: float, version: int, **ids: Any) -> Sample:
        return Sample(self.prompt_ids, self.completion_ids, self.logprobs, reward=reward, advantage=advantage,
                      agent=agent.name, policy=agent.policy, version=version, ids=ids)


class Generator(Protocol):
    versions: Mapping[str, int]

    def generate(self, requests: Sequence[tuple[Agent, str]], n: int, seed: int) -> list[list[Generation]]:
        """`n` generations for each `(agent, prompt_text)` request, in request order."""


class PolicyGenerator:
    """Generates with real policies: one sampler call per policy per `generate`."""

    def __init__(self, policies: Mapping[str, Any], sampler: Any, max_prompt_len: int | None = None):
        self.policies, self.sampler, self.max_prompt_len = policies, sampler, max_prompt_len

    @property
    def versions(self) -> dict[str, int]:
        return {name: p.version for name, p in self.policies.items()}

    def generate(self, requests, n, seed):
        out: list[list[Generation] | None] = [None] * len(requests)
        by_policy: dict[str, list[int]] = {}
        for i, (agent, _) in enumerate(requests):
            by_policy.setdefault(agent.policy, []).append(i)
        jobs = [(k, name, idx) for k, (name, idx) in enumerate(sorted(by_policy.items()))]
        if len(jobs) > 1 and disjoint_devices([self.policies[name] for _, name, _ in jobs]):
            # policies on separate devices sample at the same time (JAX releases the GIL while they run)
            with ThreadPoolExecutor(len(jobs)) as pool:
                results = list(pool.map(lambda job: self._generate_one(requests, n, seed, *job), jobs))
        else:
            results = [self._generate_one(requests, n, seed, *job) for job in jobs]
        for (_, _, idx), gens in zip(jobs, results):
            for i, g in zip(idx, gens):
                out[i] = g
        return out

    def _generate_one(self, requests, n, seed, k, name, idx) -> list[list[Generation]]:
        policy = self.policies[name]
        tok = policy.tokenizer
        prompts = [tok(requests[i][1])["input_ids"] for i in idx]
        if self.max_prompt_len:  # keep the end of an over-long prompt (the question is last)
            prompts = [p[-self.max_prompt_len:] for p in prompts]
        res = policy.generate(prompts, n=n, seed=(seed * 1009 + k) % 2**32, sampler=self.sampler)
        out = []
        for j in range(len(idx)):
            gens = []
            for r in range(j * n, (j + 1) * n):
                L = int(res.lengths[r])
                ids = res.tokens[r, :L]
                gens.append(Generation(tok.decode(ids, skip_special_tokens=True), np.asarray(prompts[j]),
                                       ids, res.sampling_logprobs[r, :L], str(res.finish_reason[r])))
            out.append(gens)
        return out


def disjoint_devices(policies: Sequence[Any]) -> bool:
    """True when every policy samples on its own mesh and no two meshes share a device."""
    seen: set = set()
    for p in policies:
        mesh = getattr(p, "sampler_mesh", None)
        if mesh is None:
            return False
        devices = set(mesh.devices.flat)
        if devices & seen:
            return False
        seen |= devices
    return True


class ScriptedGenerator:
    """Deterministic text from `script(agent, prompt, k, seed) -> str` (k: sample index),
    tokenised as bytes; for structural tests of workflows without a model."""

    def __init__(self, script: Callable[[Agent, str, int, int], str], versions: Mapping[str, int] | None = None):
        self.script = script
        self.versions = dict(versions or {})
        self.calls: list[tuple[str, int]] = []  # (policy, number of prompts) per sampler batch

    def generate(self, requests, n, seed):
        policies = sorted({a.policy for a, _ in requests})
        self.calls += [(p, sum(a.policy == p for a, _ in requests)) for p in policies]
        encode = lambda s: np.frombuffer(s.encode(), np.uint8).astype(np.int32)  # noqa: E731
        out = []
        for agent, prompt in requests:
            texts = [self.script(agent, prompt, k, seed) for k in range(n)]
            out.append([Generation(t, encode(prompt), encode(t), np.zeros(len(t.encode()), np.float32))
                        for t in texts])
        return out


@dataclasses.dataclass
class Rollout:
    """A workflow's output for one batch of problems."""

    samples: list[Sample]
    metrics: dict[str, float]
