"""The workflow contract: a typed config, a `Workflow` that plays, credits and evaluates, and a registry.

A workflow is one module: a config class (a `BaseWorkflowConfig` whose `kind`
is a Literal naming the workflow) and a `Workflow[Config]` subclass registered
under that kind. The workflow reads its options from `self.cfg`; `play` asks a
`Generator` for text, scores it with a `Verifier` and returns `Episodes` (one
row of columns per generation); `credit` turns those columns into advantages
with the kernels. `rollout` (here, shared) runs play, shapes the rewards
(`overlong`), runs credit and hands the trainer a `Rollout` of arrays; the
trainer does everything common (per-agent metrics, buffers, versions, updates,
checkpoints).

An agent's turn, one completion or a tool episode, goes through
`marljax.workflows.turns.run_turns`; a workflow that can use tools takes a
`tools:` option (`turns.ToolsConfig`). A kind that became an option of another
stays readable from YAML through `register_alias`.

    class EchoConfig(BaseWorkflowConfig):
        kind: Literal["echo"] = "echo"
        group_size: int = Field(4, ge=2)

    @register_workflow("echo")
    class EchoWorkflow(Workflow[EchoConfig]):
        def play(self, problems, agents, generator, verifier, seed) -> Episodes: ...
        def credit(self, episodes) -> advantages: ...
        def evaluate(self, problems, agents, generator, verifier, train_generator=None): ...
"""

from __future__ import annotations

import abc
import dataclasses
import inspect
import string
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import numpy as np
from pydantic import Field, model_validator

from marljax import kernels
from marljax.rewards import Problem, Verifier
from marljax.settings import StrictModel, check_kind_default
from marljax.workflows.episodes import Episodes
from marljax.workflows.types import Generation, Prompt, Rollout


class OverlongConfig(StrictModel):
    """DAPO's soft overlong punishment (`marljax.kernels.overlong_penalty`): 0 up to `max_len -
    buffer_len` completion tokens, then falling linearly to `-factor` at `max_len` and beyond."""

    max_len: int = Field(ge=1, description="completion length (tokens) that gets the full penalty")
    buffer_len: int = Field(ge=1, description="tokens before max_len over which the penalty ramps up")
    factor: float = Field(1.0, ge=0, description="size of the full penalty")

    @model_validator(mode="after")
    def _buffer_fits(self):
        if self.buffer_len > self.max_len:
            raise ValueError(f"buffer_len ({self.buffer_len}) must be <= max_len ({self.max_len})")
        return self


class BaseWorkflowConfig(StrictModel):
    """Base of each workflow's typed options (`kind` names the workflow in YAML)."""

    kind: str
    module: str | None = Field(
        None,
        description="module that registers this kind, imported before the section is read "
        "(a workflow defined outside marljax.workflows)",
    )
    overlong: OverlongConfig | None = Field(
        None, description="DAPO's overlong penalty, added to each completion's reward before credit"
    )

    def check_agents(self, agents: Mapping[str, Any]) -> list[tuple[tuple[str, ...], str, Any]]:
        """Cross-checks against the run's agents: `(key under workflow, problem, value)` each."""
        return []


@dataclasses.dataclass(frozen=True)
class Agent:
    """A logical agent: its name, the policy it acts with and how it phrases its prompt."""

    name: str
    policy: str
    role: str = ""
    template: str = "{role}{problem}"

    def render(self, problem: str, feedback: str = "", history: str = "") -> Prompt:
        """The template filled in; as chat, the role is the system message and the rest the user's."""
        text = self.template.format(role=self.role, problem=problem, feedback=feedback, history=history)
        if not (self.role and "role" in template_fields(self.template)):
            return Prompt(text, [("user", text)])
        user = self.template.format(role="", problem=problem, feedback=feedback, history=history)
        return Prompt(text, [("system", self.role.strip()), ("user", user.strip())])

    def render_in_context(self, problem: str, feedback: str = "", history: str = "") -> Prompt:
        """`render`, with the history and feedback appended to the problem text (in that order)
        when the template has no place for them (the default `{role}{problem}` has none)."""
        used = set(template_fields(self.template))
        extra = [
            text for name, text in (("history", history), ("feedback", feedback)) if text and name not in used
        ]
        return self.render("\n\n".join([problem, *extra]), feedback=feedback, history=history)


def template_fields(template: str) -> list[str]:
    """Placeholder names used by a format string (raises ValueError when malformed)."""
    return [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]


class Generator(Protocol):
    def generate(self, requests: Sequence[tuple[Agent, str]], n: int, seed: int) -> list[list[Generation]]:
        """`n` generations for each `(agent, prompt)` request, in request order, each stamped with
        the agent's name, its policy and that policy's current version. A `Prompt` carries its chat
        messages too; a plain string is one user turn."""


class ScriptedGenerator:
    """Deterministic text from `script(agent, prompt, k, seed) -> str` (k: sample index), for
    structural tests of workflows without a model, tokenised as bytes; or, given `policies` (name ->
    `marljax.train.policy.Policy`), as that policy's sampler would see and write it (prompt ids from
    its `encode_prompt`, the text's tokens then an end-of-turn token), so that prompts continuing a
    scripted turn (`Prompt.continued`) encode as they will when the policy samples (demonstrations)."""

    def __init__(
        self,
        script: Callable[[Agent, str, int, int], str],
        versions: Mapping[str, int] | None = None,
        policies: Mapping[str, Any] | None = None,
    ):
        self.script = script
        self.versions = dict(versions or {})
        self.policies = dict(policies or {})
        self.calls: list[tuple[str, int]] = []  # (policy, number of prompts) per sampler batch

    def generate(self, requests: Sequence[tuple[Agent, str]], n: int, seed: int) -> list[list[Generation]]:
        policies = sorted({a.policy for a, _ in requests})
        self.calls += [(p, sum(a.policy == p for a, _ in requests)) for p in policies]
        out = []
        for agent, prompt in requests:
            policy = self.policies.get(agent.policy)
            prompt_ids = (
                _bytes(prompt) if policy is None else np.asarray(policy.encode_prompt(prompt), np.int32)
            )
            gens = []
            for k in range(n):
                text = self.script(agent, prompt, k, seed)
                if policy is None:
                    completion_ids, finish = _bytes(text), "stop"
                else:
                    completion_ids, finish = np.asarray(policy.encode_completion(text), np.int32), "eos"
                gens.append(
                    Generation(
                        text,
                        prompt_ids,
                        completion_ids,
                        np.zeros(len(completion_ids), np.float32),
                        finish,
                        agent=agent.name,
                        policy=agent.policy,
                        version=self.versions.get(agent.policy, 0),
                    )
                )
            out.append(gens)
        return out


def _bytes(text: str) -> np.ndarray:
    return np.frombuffer(text.encode(), np.uint8).astype(np.int32)


C = TypeVar("C", bound=BaseWorkflowConfig)


class Workflow(abc.ABC, Generic[C]):
    """Base of every workflow: owns its config `cfg` (of the type in `Workflow[...]`).

    Build one from a config object, or from its options: by keyword, or by
    position in the config's field order. State that must survive a restart
    (e.g. running averages) goes through `state_dict` / `load_state_dict`,
    which the trainer checkpoints with the loop.
    """

    config_type: ClassVar[type[BaseWorkflowConfig]]
    cfg: C

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for base in getattr(cls, "__orig_bases__", ()):
            if typing.get_origin(base) is Workflow:
                (cls.config_type,) = typing.get_args(base)

    def __init__(self, *args: Any, **options: Any):
        if len(args) == 1 and not options and isinstance(args[0], BaseWorkflowConfig):
            if not isinstance(args[0], self.config_type):
                raise TypeError(
                    f"{type(self).__name__} is configured by {self.config_type.__name__}, "
                    f"not {type(args[0]).__name__}"
                )
            self.cfg = args[0]
            return
        # positional options are the workflow's own, in order (not the shared `kind` / `overlong`)
        names = [
            name for name in self.config_type.model_fields if name not in BaseWorkflowConfig.model_fields
        ]
        if len(args) > len(names):
            raise TypeError(f"{type(self).__name__} takes at most {len(names)} options, got {len(args)}")
        self.cfg = self.config_type(**dict(zip(names, args)), **options)

    @classmethod
    def from_config(cls, cfg: C) -> Workflow[C]:
        return cls(cfg)

    def length_penalties(self, generations: Sequence[Generation]) -> np.ndarray:
        """`overlong`'s penalty of each generation by its completion length (zeros when unset): the
        reward shaping `rollout` adds to each reward between play and credit."""
        o = self.cfg.overlong
        if o is None:
            return np.zeros(len(generations))
        # a multi-turn sequence counts the tokens the agent wrote, not the tool results between them
        lengths = np.array(
            [
                len(g.completion_ids) if g.completion_mask is None else int(g.completion_mask.sum())
                for g in generations
            ],
            np.int32,
        )
        return np.asarray(kernels.overlong_penalty(lengths, o.max_len, o.buffer_len, o.factor), np.float64)

    def overlong_metrics(self, rollout: Rollout) -> dict[str, float]:
        """`overlong/penalty` (mean) and `overlong/frac_penalized` of the rollout's completions."""
        if self.cfg.overlong is None:
            return {}
        penalties = self.length_penalties(rollout.generations)
        return {
            "overlong/penalty": float(penalties.mean()),
            "overlong/frac_penalized": float((penalties < 0).mean()),
        }

    def rollout(
        self,
        problems: Sequence[Problem],
        agents: Mapping[str, Agent],
        generator: Generator,
        verifier: Verifier,
        seed: int,
    ) -> Rollout:
        """Play, shape the rewards, credit: one batch of problems as a `Rollout`."""
        episodes = self.play(problems, agents, generator, verifier, seed)
        if not episodes.shaped:
            rewards = episodes["reward"]
            episodes["reward"] = rewards + self.length_penalties(episodes.generations).astype(rewards.dtype)
            episodes.shaped = True
        advantages = np.asarray(self.credit(episodes))
        return Rollout(
            episodes.generations,
            episodes.ids,
            episodes["reward"],
            advantages.reshape(-1),
            episodes["passed"],
            episodes.extras,
        )

    @abc.abstractmethod
    def play(
        self,
        problems: Sequence[Problem],
        agents: Mapping[str, Agent],
        generator: Generator,
        verifier: Verifier,
        seed: int,
    ) -> Episodes:
        """Sample and score one batch of problems (`seed` fixes every random choice)."""

    @abc.abstractmethod
    def credit(self, episodes: Episodes) -> Any:
        """Advantages `[N]` (an array) of the played episodes, from their columns (shaped rewards)."""

    @abc.abstractmethod
    def evaluate(
        self,
        problems: Sequence[Problem],
        agents: Mapping[str, Agent],
        generator: Generator,
        verifier: Verifier,
        train_generator: Generator | None = None,
    ) -> dict[str, float]:
        """Held-out metrics, keys `eval/...`. `generator` samples as evaluation does (greedy by
        default); `train_generator` as training does, for a test-time search that must not decode
        greedily (most workflows leave it unused)."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        del state  # stateless by default


# kind -> (config class, workflow class); the run config's `workflow` section is validated
# against the config classes, in registration order (the first is the default kind).
REGISTRY: dict[str, tuple[type[BaseWorkflowConfig], type[Workflow]]] = {}


def register_workflow(kind: str) -> Callable[[type[Workflow]], type[Workflow]]:
    """Class decorator: make a `Workflow[Config]` subclass the workflow of `workflow.kind: <kind>`."""

    def register(cls: type[Workflow]) -> type[Workflow]:
        if not (isinstance(cls, type) and issubclass(cls, Workflow)):
            raise TypeError(f"@register_workflow({kind!r}) needs a Workflow subclass, got {cls!r}")
        if inspect.isabstract(cls):
            missing = ", ".join(sorted(cls.__abstractmethods__))
            raise TypeError(f"workflow {cls.__name__} cannot be registered: it does not implement {missing}")
        config = getattr(cls, "config_type", None)
        if not (isinstance(config, type) and issubclass(config, BaseWorkflowConfig)):
            raise TypeError(f"workflow {cls.__name__} must subclass Workflow[<its BaseWorkflowConfig>]")
        check_kind_default(config, kind)
        known = REGISTRY.get(kind)
        if known is not None and _qualified(known[1]) != _qualified(cls):
            raise ValueError(f"workflow kind {kind!r} is already registered by {_qualified(known[1])}")
        REGISTRY[kind] = (config, cls)
        return cls

    return register


# old kind -> how its YAML section reads as a registered kind's (a workflow that became an option
# of another, e.g. `sharp_tools` -> `sharp` with `tools`); the run config applies it before validating
ALIASES: dict[str, Callable[[dict], dict]] = {}


def register_alias(kind: str, rewrite: Callable[[dict], dict]) -> None:
    """Keep `workflow.kind: <kind>` working: `rewrite` turns such a section into a registered kind's."""
    if kind in REGISTRY:
        raise ValueError(f"workflow kind {kind!r} is registered; it cannot also be an alias")
    ALIASES[kind] = rewrite


def resolve_alias(section: Any) -> Any:
    """A `workflow` section with an alias kind rewritten (anything else as it is)."""
    if isinstance(section, Mapping) and section.get("kind") in ALIASES:
        return ALIASES[section["kind"]](dict(section))
    return section


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def build_workflow(cfg: BaseWorkflowConfig) -> Workflow:
    """The workflow for a config's `workflow` section (dispatch on `kind`)."""
    if cfg.kind not in REGISTRY:
        raise ValueError(f"unknown workflow kind {cfg.kind!r}; known: {sorted(REGISTRY)}")
    return REGISTRY[cfg.kind][1](cfg)
