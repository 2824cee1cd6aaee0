"""The trainer's `Generator`: workflows' requests sampled with the real policies.

All requests of one policy go to the sampler as one batch (across problems,
trees and agents sharing the policy); policies on disjoint devices sample at
the same time. Each generation is stamped with its agent, policy and the
policy's version, which the buffers use for staleness.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from marljax.seeds import derive_seed
from marljax.train.config import SamplerConfig
from marljax.train.policy import Policy
from marljax.workflows.base import Agent
from marljax.workflows.types import Generation

logger = logging.getLogger(__name__)


class PolicyGenerator:
    """Generates with real policies: one sampler call per policy per `generate`."""

    def __init__(
        self, policies: Mapping[str, Policy], sampler: SamplerConfig, max_prompt_len: int | None = None
    ):
        self.policies, self.sampler, self.max_prompt_len = policies, sampler, max_prompt_len
        self._warned: set[str] = set()

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

    def generate(self, requests: Sequence[tuple[Agent, str]], n: int, seed: int) -> list[list[Generation]]:
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

    def _generate_one(
        self, requests: Sequence[tuple[Agent, str]], n: int, seed: int, k: int, name: str, idx: list[int]
    ) -> list[list[Generation]]:
        policy = self.policies[name]
        tok = policy.tokenizer
        prompts = [self._fit(requests[i][0].name, policy.encode_prompt(requests[i][1])) for i in idx]
        version = policy.version
        res = policy.generate(prompts, n=n, seed=derive_seed(seed, k, "policy"), sampler=self.sampler)
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
                        policy=name,
                        version=version,
                        temperature=self.sampler.temperature or 1.0,  # greedy: the model's own
                    )
                )
            out.append(gens)
        return out


def disjoint_devices(policies: Sequence[Policy]) -> bool:
    """True when every policy samples on its own mesh and no two meshes share a device."""
    seen: set = set()
    for p in policies:
        mesh = p.sampler_mesh
        if mesh is None:
            return False
        devices = set(mesh.devices.flat)
        if devices & seen:
            return False
        seen |= devices
    return True
