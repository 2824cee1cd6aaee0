"""The trainer's `Generator`: workflows' requests sampled with the real policies.

All requests of one policy go to the sampler as one batch (across problems,
trees and agents sharing the policy), and so do all requests of the adapter
policies on one base (each row with its own adapter); policies on disjoint
devices sample at the same time. Each agent samples with its own settings
(`RunConfig.agent_sampling`: temperature, top-p, top-k, budget, stop strings);
requests of agents with other stop strings go to separate calls. Each generation
is stamped with its agent, policy, the policy's version (the buffers use it for
staleness) and the temperature it was sampled at (the trainer's log-probs use it).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from marljax.sampler.sampling import logprob_temperature
from marljax.sampler.schedule import SamplingParams
from marljax.seeds import derive_seed
from marljax.train.config import SamplerConfig
from marljax.train.policy import Policy
from marljax.workflows.base import Agent
from marljax.workflows.types import Generation

logger = logging.getLogger(__name__)


class PolicyGenerator:
    """Generates with real policies: one sampler call per policy (or base of adapter policies)
    and stop-string set per `generate`.

    `sampler`: the run's sampler block; `agent_sampling`: each agent's resolved settings (an
    agent without an entry uses `sampler`)."""

    def __init__(
        self,
        policies: Mapping[str, Policy],
        sampler: SamplerConfig,
        max_prompt_len: int | None = None,
        agent_sampling: Mapping[str, SamplerConfig] | None = None,
    ):
        self.policies, self.sampler, self.max_prompt_len = policies, sampler, max_prompt_len
        self.agent_sampling = {a: s.sampling() for a, s in (agent_sampling or {}).items()}
        self.default_sampling = sampler.sampling()
        self._warned: set[str] = set()

    def settings(self, agent: str) -> SamplingParams:
        return self.agent_sampling.get(agent, self.default_sampling)

    def _fit(self, agent: str, ids: list[int]) -> list[int]:
        """`ids` cut to `max_prompt_len` by dropping the middle: the start (system turn, the problem's
        beginning) and the end (the latest feedback, the generation prompt) stay."""
        limit = self.max_prompt_len
        if not limit or len(ids) <= limit:
            return ids
        if agent not in self._warned:  # once per agent and run
            self._warned.add(agent)
            logger.warning(
                "agent %r: a prompt of %d tokens was cut to %d (sampler.max_prompt_len) by dropping its "
                "middle; further cuts of this agent's prompts are not reported",
                agent,
                len(ids),
                limit,
            )
        head = limit // 4
        return ids[:head] + ids[len(ids) - (limit - head) :]

    def _call_key(self, agent: Agent) -> tuple:
        """Requests with equal keys share a sampler call: one policy, or adapter policies of one base
        sampling on one mesh; one set of stop strings."""
        view = self.policies[agent.policy].sampler
        who = agent.policy if view.base_key is None else (view.base_key, view.mesh)
        return (who, self.settings(agent.name).stop)

    def generate(self, requests: Sequence[tuple[Agent, str]], n: int, seed: int) -> list[list[Generation]]:
        out: list[list[Generation] | None] = [None] * len(requests)
        calls: dict[tuple, list[int]] = {}
        for i, (agent, _) in enumerate(requests):
            calls.setdefault(self._call_key(agent), []).append(i)

        def order(idx):  # by policy name first: a run of plain policies keeps one call (and seed) per policy
            return (min(requests[i][0].policy for i in idx), self.settings(requests[idx[0]][0].name).stop)

        jobs = list(enumerate(sorted(calls.values(), key=order)))
        leads = [self.policies[min(requests[i][0].policy for i in idx)] for _, idx in jobs]
        if len(jobs) > 1 and disjoint_devices(leads):
            # policies on separate devices sample at the same time (JAX releases the GIL while they run)
            with ThreadPoolExecutor(len(jobs)) as pool:
                results = list(pool.map(lambda job: self._generate_one(requests, n, seed, *job), jobs))
        else:
            results = [self._generate_one(requests, n, seed, *job) for job in jobs]
        for (_, idx), gens in zip(jobs, results):
            for i, g in zip(idx, gens):
                out[i] = g
        return out

    def _generate_one(
        self, requests: Sequence[tuple[Agent, str]], n: int, seed: int, k: int, idx: list[int]
    ) -> list[list[Generation]]:
        names = sorted({requests[i][0].policy for i in idx})
        lead = self.policies[names[0]]
        tok = lead.turns.tokenizer  # adapter policies on one base share its tokenizer
        prompts = [
            self._fit(agent.name, self.policies[agent.policy].turns.encode_prompt(text))
            for agent, text in (requests[i] for i in idx)
        ]
        settings = [self.settings(requests[i][0].name) for i in idx]
        versions = {name: self.policies[name].version for name in names}
        team = [self.policies[name].sampler for name in names] if lead.sampler.base_key is not None else None
        res = lead.sampler.generate(
            prompts,
            n=n,
            seed=derive_seed(seed, k, "policy"),
            sampler=self.sampler,
            sampling=settings,
            team=team,
            adapter=[names.index(requests[i][0].policy) for i in idx],
        )
        out = []
        for j, i in enumerate(idx):
            agent = requests[i][0]
            gens = []
            for r in range(j * n, (j + 1) * n):
                L = int(res.lengths[r])
                ids = res.tokens[r, :L]
                gens.append(
                    Generation(
                        tok.decode(ids, skip_special_tokens=True),
                        np.asarray(prompts[j]),
                        ids,
                        res.logprobs[r, :L],
                        str(res.finish_reason[r]),
                        agent=agent.name,
                        policy=agent.policy,
                        version=versions[agent.policy],
                        temperature=logprob_temperature(settings[j].temperature),
                    )
                )
            out.append(gens)
        return out


def disjoint_devices(policies: Sequence[Policy]) -> bool:
    """True when every policy samples on its own mesh and no two meshes share a device."""
    seen: set = set()
    for p in policies:
        mesh = p.sampler.mesh
        if mesh is None:
            return False
        devices = set(mesh.devices.flat)
        if devices & seen:
            return False
        seen |= devices
    return True
