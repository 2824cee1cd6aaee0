"""What workflows hand to the trainer: a `Rollout` of arrays over completions, and its training `Rows`.

Entry i of every array of a `Rollout` belongs to completion i: one agent's
completion at one node of one episode (or search tree), with its reward,
advantage and pass flag. Credit assignment (the kernels) runs in the
workflow's `credit`, because only it knows the group structure; the statistics every
workflow reports per agent are computed here, once, from the arrays.
The trainer routes the rows to their policy's buffer.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from marljax import kernels

ID_FIELDS = ("problem", "episode", "node", "parent", "depth", "turn")


class Prompt(str):
    """An agent's prompt: its raw text (the string itself, tokenized as is when chat is off) and the
    same request as chat `messages` (`(role, content)` pairs ending with a user turn, or a tool turn
    holding tool results), which the generator renders with the tokenizer's chat template when
    chat is on. `tools`: the function schemas the agent may call (`marljax.envs.tool_calls.
    tool_schema`), given to the template's `tools=` argument (the raw text must describe them
    itself). Workflows may use it as a string; string operations give a plain `str`, which the
    generator sends as one user turn."""

    messages: tuple[tuple[str, str], ...]
    tools: tuple[dict[str, Any], ...]
    continues: Continuation | None

    def __new__(
        cls,
        text: str,
        messages: Sequence[tuple[str, str]],
        tools: Sequence[Mapping[str, Any]] = (),
        continues: Continuation | None = None,
    ):
        self = super().__new__(cls, text)
        self.messages = tuple((str(role), str(content)) for role, content in messages)
        self.tools = tuple(dict(t) for t in tools)
        self.continues = continues
        if not self.messages or self.messages[-1][0] not in ("user", "tool"):
            raise ValueError(f"a prompt's messages must end with a user or tool turn, got {self.messages}")
        return self

    def __getnewargs__(self):
        return str(self), self.messages, self.tools, self.continues

    def continued(self, answer: str | Generation, follow_up: str, text: str, role: str = "user") -> Prompt:
        """This conversation after the agent answered `answer`, then `follow_up` (the user's, or
        tool results with `role="tool"`); `text` is the same request as raw text (which carries the
        earlier turns inside it). The tools stay.

        Given the answer's `Generation`, the new prompt also records its tokens (`continues`): the
        generator of that policy then encodes the new prompt as those exact tokens followed by the
        new turn's, so that a multi-turn episode can be trained as one sequence (`merge_turns`)."""
        if not isinstance(answer, Generation):
            return Prompt(text, (*self.messages, ("assistant", answer), (role, follow_up)), self.tools)
        raw = str(self) + answer.text
        tail = text[len(raw) :] if text.startswith(raw) else None
        after = Continuation(
            answer.policy,
            tuple(int(i) for i in (*answer.prompt_ids, *answer.completion_ids)),
            answer.finish_reason == "eos",
            tail,
        )
        messages = (*self.messages, ("assistant", answer.text), (role, follow_up))
        return Prompt(text, messages, self.tools, after)


@dataclasses.dataclass(frozen=True)
class Continuation:
    """The tokens a continued prompt starts with: the earlier prompt and the completion that answered
    it (`policy`'s token ids, ending with an end-of-turn token when `ended`), and the raw text that
    follows them (`raw_tail`, None when the raw text does not extend the earlier one)."""

    policy: str
    ids: tuple[int, ...]
    ended: bool
    raw_tail: str | None


@dataclasses.dataclass(frozen=True)
class Generation:
    """One sampled completion: its text, token ids and the sampler's log-probs (under
    `softmax(logits / temperature)`), stamped by the generator with the agent that asked for it,
    that agent's policy and the policy's version."""

    text: str
    prompt_ids: np.ndarray
    completion_ids: np.ndarray
    logprobs: np.ndarray
    finish_reason: str = "stop"
    agent: str = ""
    policy: str = ""
    version: int = 0
    temperature: float = 1.0
    completion_mask: np.ndarray | None = None  # [C] 1: sampled (trained), 0: observation; None: all 1


def merge_turns(turns: Sequence[Generation]) -> Generation | None:
    """One agent's turns of an episode as one sequence (verl's multi-turn convention): the first
    prompt, then each completion followed by the tokens the next prompt added (tool results, the
    template's turn markup), which `completion_mask` leaves out of the loss (log-prob 0). Each
    prompt must start with the previous prompt and completion (`Prompt.continued` with the
    `Generation` makes the trainer's generator encode it so); None when one does not, or when the
    turns come from different policies or temperatures."""
    if not turns:
        raise ValueError("merge_turns needs at least one turn")
    first = turns[0]
    ids, logps, mask = [first.completion_ids], [first.logprobs], [np.ones(len(first.completion_ids), bool)]
    for prev, nxt in zip(turns, turns[1:]):
        head = np.concatenate([prev.prompt_ids, prev.completion_ids])
        same = (nxt.policy, nxt.temperature, nxt.version) == (prev.policy, prev.temperature, prev.version)
        if (
            not same
            or len(nxt.prompt_ids) < len(head)
            or not np.array_equal(nxt.prompt_ids[: len(head)], head)
        ):
            return None
        observed = np.asarray(nxt.prompt_ids[len(head) :])
        ids += [observed, nxt.completion_ids]
        logps += [np.zeros(len(observed), np.float32), nxt.logprobs]
        mask += [np.zeros(len(observed), bool), np.ones(len(nxt.completion_ids), bool)]
    last = turns[-1]
    return dataclasses.replace(
        last,
        text="".join(t.text for t in turns),
        prompt_ids=first.prompt_ids,
        completion_ids=np.concatenate(ids).astype(np.int32),
        logprobs=np.concatenate(logps).astype(np.float32),
        completion_mask=np.concatenate(mask),
    )


def _column(values: Any, n: int, default: Any, dtype: Any) -> np.ndarray:
    if values is None:
        return np.full(n, default, dtype)
    if isinstance(values, (str, int, float, np.number)):
        return np.full(n, values, dtype)
    return np.asarray(values, dtype).reshape(-1)


@dataclasses.dataclass(frozen=True, eq=False)
class Rows:
    """Training rows: a struct of columns, row i one completion (a rollout's, or an SFT pair's).

    Ragged columns (a tuple per row, host numpy): prompt_ids `[P]` and
    completion_ids `[C]` (int32), sampling_logprobs `[C]` (float32: the
    sampler's log-probs of the completion tokens under `softmax(logits /
    temperature)`, for truncated importance sampling), completion_mask `[C]`
    (bool, or None: every token) marking the completion tokens the loss covers
    (a multi-turn sequence, `merge_turns`, leaves out the tool results and turn
    markup between the agent's turns). Columns `[N]`: reward (float64),
    advantage and passed (float32; passed is 1 when the outcome a row was
    credited with passed every test, 0 when not, the fraction of passing
    outcomes when it took part in several: MAGRPO's cross product),
    temperature (float64: the one it was sampled at, which the trainer's
    log-probs, entropy and KL use too; top-k / top-p truncation is in neither
    side's log-probs, so equal parameters give an importance ratio of exactly
    1), version (int64: the policy version that generated it, for staleness),
    agent and policy (str), ids (each row's `ID_FIELDS`: problem, episode/tree,
    node, parent (-1 at a root), depth, turn).

    Omitted per-row columns take their defaults (reward, advantage, passed 0;
    temperature 1; version 0; agent, policy ""; ids {}; mask None); a scalar
    fills its whole column."""

    prompt_ids: Sequence[Any]
    completion_ids: Sequence[Any]
    sampling_logprobs: Sequence[Any]
    completion_mask: Sequence[Any] | None = None
    reward: Any = None
    advantage: Any = None
    passed: Any = None
    temperature: Any = None
    version: Any = None
    agent: Any = None
    policy: Any = None
    ids: Sequence[Mapping[str, Any]] | None = None

    def __post_init__(self) -> None:
        n = len(self.prompt_ids)
        put = functools.partial(object.__setattr__, self)
        put("prompt_ids", tuple(np.asarray(x, np.int32).reshape(-1) for x in self.prompt_ids))
        put("completion_ids", tuple(np.asarray(x, np.int32).reshape(-1) for x in self.completion_ids))
        put("sampling_logprobs", tuple(np.asarray(x, np.float32).reshape(-1) for x in self.sampling_logprobs))
        masks = self.completion_mask if self.completion_mask is not None else [None] * n
        put("completion_mask", tuple(None if m is None else np.asarray(m, bool).reshape(-1) for m in masks))
        put("reward", _column(self.reward, n, 0.0, np.float64))
        put("advantage", _column(self.advantage, n, 0.0, np.float32))
        put("passed", _column(self.passed, n, 0.0, np.float32))
        put("temperature", _column(self.temperature, n, 1.0, np.float64))
        put("version", _column(self.version, n, 0, np.int64))
        for name in ("agent", "policy"):
            v = getattr(self, name)
            put(name, tuple([v or ""] * n if v is None or isinstance(v, str) else (str(x) for x in v)))
        put("ids", tuple({} for _ in range(n)) if self.ids is None else tuple(dict(i) for i in self.ids))
        sizes = {f.name: len(getattr(self, f.name)) for f in dataclasses.fields(self)}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"rows need one entry per row in each column, got sizes {sizes}")
        for b in range(n):
            self._check_row(b)

    def _check_row(self, b: int) -> None:
        C = self.completion_ids[b].shape
        if self.sampling_logprobs[b].shape != C:
            raise ValueError(
                f"row {b}: sampling_logprobs has shape {self.sampling_logprobs[b].shape}, "
                f"completion_ids {C}: one log-prob per completion token"
            )
        mask = self.completion_mask[b]
        if mask is not None and mask.shape != C:
            raise ValueError(
                f"row {b}: completion_mask has shape {mask.shape}, "
                f"completion_ids {C}: one flag per completion token"
            )
        if not self.temperature[b] > 0:
            raise ValueError(
                f"temperature must be > 0 (greedy samples are not trained), got {self.temperature[b]}"
            )
        unknown = set(self.ids[b]) - set(ID_FIELDS)
        if unknown:
            raise ValueError(f"unknown row ids {sorted(unknown)}; known: {ID_FIELDS}")

    def __len__(self) -> int:
        return len(self.prompt_ids)

    def __getitem__(self, which: slice | Sequence[int] | np.ndarray) -> Rows:
        """The rows `which` picks (a slice, indices or a boolean mask), in that order."""
        idx = np.arange(len(self))[which]
        return Rows(**{f.name: [getattr(self, f.name)[i] for i in idx] for f in dataclasses.fields(self)})

    def to_json(self) -> dict[str, Any]:
        """The columns as JSON-able lists (for the loop checkpoint); `from_json` inverts it exactly
        (float32 -> float64 -> JSON text -> float64 -> float32 is exact)."""
        return {
            "prompt_ids": [x.tolist() for x in self.prompt_ids],
            "completion_ids": [x.tolist() for x in self.completion_ids],
            "sampling_logprobs": [x.astype(np.float64).tolist() for x in self.sampling_logprobs],
            "completion_mask": [None if m is None else m.astype(int).tolist() for m in self.completion_mask],
            **{
                k: getattr(self, k).tolist()
                for k in ("reward", "advantage", "passed", "temperature", "version")
            },
            "agent": list(self.agent),
            "policy": list(self.policy),
            "ids": [dict(i) for i in self.ids],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Rows:
        return cls(**data)

    @classmethod
    def concatenate(cls, parts: Sequence[Rows]) -> Rows:
        """The rows of `parts`, one after another."""
        return cls(
            **{f.name: [x for p in parts for x in getattr(p, f.name)] for f in dataclasses.fields(cls)}
        )


@dataclasses.dataclass(frozen=True)
class Rollout:
    """A workflow's output for one batch of problems: one entry per completion.

    generations: the completions (tokens, log-probs, agent, policy, version);
    ids: each completion's `ID_FIELDS`; rewards `[N]`, advantages `[N]` and
    passed `[N]` (in [0, 1], see `Rows`); extras: the workflow's own
    metrics (`mars2/...`, `team/...`, per-agent ones beyond `agent_metrics`).
    """

    generations: Sequence[Generation]
    ids: Sequence[Mapping[str, Any]]
    rewards: np.ndarray
    advantages: np.ndarray
    passed: np.ndarray
    extras: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        # float64 keeps rewards computed in Python exact in the rows; the kernels take float32
        object.__setattr__(self, "rewards", np.asarray(self.rewards, np.float64).reshape(-1))
        object.__setattr__(self, "advantages", np.asarray(self.advantages, np.float32).reshape(-1))
        object.__setattr__(self, "passed", np.asarray(self.passed, np.float32).reshape(-1))
        sizes = {
            "generations": len(self.generations),
            "ids": len(self.ids),
            "rewards": len(self.rewards),
            "advantages": len(self.advantages),
            "passed": len(self.passed),
        }
        if len(set(sizes.values())) > 1:
            raise ValueError(f"a rollout needs one entry per completion in each field, got sizes {sizes}")

    def __len__(self) -> int:
        return len(self.generations)

    def select(self, keep: Sequence[bool] | np.ndarray) -> Rollout:
        """The completions where `keep` is True, with the same extras."""
        idx = np.flatnonzero(np.asarray(keep, bool))
        return Rollout(
            [self.generations[i] for i in idx],
            [self.ids[i] for i in idx],
            self.rewards[idx],
            self.advantages[idx],
            self.passed[idx],
            self.extras,
        )

    @functools.cached_property
    def agent_names(self) -> tuple[str, ...]:
        return tuple(sorted({g.agent for g in self.generations}))

    @functools.cached_property
    def agent_ids(self) -> np.ndarray:
        """`[N]` int32 index of each completion's agent in `agent_names`."""
        return np.searchsorted(self.agent_names, [g.agent for g in self.generations]).astype(np.int32)

    @functools.cached_property
    def policy_names(self) -> tuple[str, ...]:
        return tuple(sorted({g.policy for g in self.generations}))

    @functools.cached_property
    def policy_ids(self) -> np.ndarray:
        """`[N]` int32 index of each completion's policy in `policy_names`."""
        return np.searchsorted(self.policy_names, [g.policy for g in self.generations]).astype(np.int32)

    @functools.cached_property
    def rows(self) -> Rows:
        """The training rows of the completions, in order (what the trainer routes to the buffers)."""
        g = self.generations
        return Rows(
            [x.prompt_ids for x in g],
            [x.completion_ids for x in g],
            [x.logprobs for x in g],
            [x.completion_mask for x in g],
            reward=self.rewards,
            advantage=self.advantages,
            passed=self.passed,
            temperature=[x.temperature for x in g],
            version=[x.version for x in g],
            agent=[x.agent for x in g],
            policy=[x.policy for x in g],
            ids=self.ids,
        )

    @property
    def metrics(self) -> dict[str, float]:
        """`agent_metrics`, `amplification_metrics` and the workflow's extras: the rollout's part of a
        training step's record."""
        common = {**agent_metrics(self), **amplification_metrics(self)}
        clash = sorted(set(common) & set(self.extras))
        if clash:
            raise ValueError(
                f"workflow metrics {clash} are computed from the rollout; leave them out of extras"
            )
        return {**common, **self.extras}


def concatenate(rollouts: Sequence[Rollout]) -> Rollout:
    """One rollout of the completions of several; an extra is its mean over the rollouts reporting it."""
    keys = dict.fromkeys(k for r in rollouts for k in r.extras)
    return Rollout(
        [g for r in rollouts for g in r.generations],
        [i for r in rollouts for i in r.ids],
        np.concatenate([r.rewards for r in rollouts]),
        np.concatenate([r.advantages for r in rollouts]),
        np.concatenate([r.passed for r in rollouts]),
        {k: float(np.mean([r.extras[k] for r in rollouts if k in r.extras])) for k in keys},
    )


def agent_metrics(rollout: Rollout) -> dict[str, float]:
    """`agent/<name>/{reward, pass_rate, adv_mean, adv_std}` of each agent with completions in the
    rollout: means and population std over its completions."""
    out: dict[str, float] = {}
    advantages = rollout.advantages.astype(np.float64)
    for k, name in enumerate(rollout.agent_names):
        mine = rollout.agent_ids == k
        out.update(
            {
                f"agent/{name}/reward": float(rollout.rewards[mine].mean()),
                f"agent/{name}/pass_rate": float(rollout.passed[mine].astype(np.float64).mean()),
                f"agent/{name}/adv_mean": float(advantages[mine].mean()),
                f"agent/{name}/adv_std": float(advantages[mine].std()),
            }
        )
    return out


def amplification_metrics(rollout: Rollout) -> dict[str, float]:
    """`agent/<name>/amplification` with two or more agents: Dr. MAS's factor by which one reward
    normalisation shared by all agents of a problem scales each agent's gradient second moment
    against agent-wise normalisation (1 for every agent when they agree), per problem group, over
    the groups where that agent's own rewards vary (`kernels.amplification_factor`)."""
    names = rollout.agent_names
    if len(names) < 2:
        return {}
    _, problems = np.unique([str(i.get("problem", "")) for i in rollout.ids], return_inverse=True)
    factor = kernels.amplification_factor(
        jnp.asarray(rollout.rewards, jnp.float32),
        jnp.asarray(rollout.agent_ids),
        len(names),
        group_ids=jnp.asarray(problems, jnp.int32),
        num_groups=int(problems.max()) + 1,
    )
    return {f"agent/{name}/amplification": float(f) for name, f in zip(names, np.asarray(factor))}
