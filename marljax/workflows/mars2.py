"""MARS2 (arXiv 2602.07848): multi-agent tree search as the RL environment, and MARS2-T+.

Per problem, a team of agents grows one search tree (`mars2_search`: GEN a
fresh solution or CONT refine a failed node, agent and action chosen by
Thompson sampling from per-agent Beta posteriors, with depth guidance
``gamma(d) ** c_d``). Refinement prompts carry the node's program and, with
``use_feedback``, the sandbox's error feedback on the *public* tests
(`marljax.rewards.error_feedback`); fresh-solution prompts never do. Trees
grow in rounds: each tree plans ``expansions_per_round`` pending nodes, and
the pending nodes of all trees go to the generator as one call (one sampler
batch per policy), then are scored together.

Training reward: fraction of all tests passed. Credit: one advantage group
per tree, ``A_n = (r_n - mean_T) / std_T`` over all nodes of tree ``T`` across
agents and depths (`marljax.kernels.mars2_advantages`); every node is a
training row routed to its agent's policy. ``normalization: agent`` instead
normalises each agent's nodes of a tree by their own statistics (Dr. MAS,
`marljax.kernels.dr_mas_advantages` with tree groups): in a team of unequal
models the weaker one's advantages are otherwise negative on average, and
pushing down everything it writes can collapse it. ``normalization: kind``
keeps a tree's fresh solutions (GEN) and refinements (CONT) in separate groups:
a refinement starts from a failed program, so its success rate differs from a
fresh attempt's, and one group per tree would credit a node for its kind.

MARS2-T+ (`search_eval`): the same search at test time with error feedback,
rewards from the public tests only; the final answer is the highest public
score or, with ``select: reward_model``, the highest score of a judge: the
agent named by ``judge`` (any agent of the run, on any policy) answers the
`JUDGE` prompt (problem, candidate, its public-test report) greedily for each
candidate, and the first number of its reply (0-10) is the score; Python
users may set the ``reward_model`` hook instead. ``ties`` picks the earliest
node (default) or the latest (MARTI). The answer is scored on the private
tests.
"""

from __future__ import annotations

import functools
import itertools
import re
import string
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np
from pydantic import Field, field_validator

from marljax import kernels
from marljax.rewards import Problem, Score, Verifier, error_feedback, extract_code
from marljax.seeds import derive_seed
from marljax.settings import StrictModel
from marljax.workflows.base import (
    Agent,
    BaseWorkflowConfig,
    Generator,
    Workflow,
    register_workflow,
    template_fields,
)
from marljax.workflows.episodes import Episodes, agentwise_advantages
from marljax.workflows.mars2_search import CONT, GEN, RewardAverage, Tree, select_final
from marljax.workflows.mars2_search import depth_gamma as make_gamma
from marljax.workflows.scoring import RewardKind, as_reward

REFINE_NOTE = "Refine the previous attempt so that it passes all tests. Reply with the complete program."
# reward_model(problem, candidate texts, their public-test reports) -> one score per candidate (higher is better)
RewardModel = Callable[[Problem, Sequence[str], Sequence[str]], Sequence[float]]
JUDGE = (
    "Below are a programming problem, a candidate solution and how it did on the public tests. "
    "How likely is the candidate to pass the hidden tests as well? Reply with one score from 0 "
    "(surely wrong) to 10 (surely right).\n\nProblem:\n{problem}\n\nCandidate:\n{candidate}\n\n"
    "Public tests: {report}"
)
_SCORE = re.compile(r"\d+(?:\.\d+)?")


def judge_model(judge: Agent, generator: Generator) -> RewardModel:
    """A `RewardModel` that asks `judge` (greedily, with `generator`) to score each candidate from 0 to
    10 given the problem and the candidate's public-test report; the first number of its reply,
    clipped to [0, 10], is the score, and a reply without a number scores 0."""

    def scores(problem: Problem, texts: Sequence[str], reports: Sequence[str]) -> list[float]:
        prompts = [
            judge.render(JUDGE.format(problem=problem.prompt, candidate=t, report=r))
            for t, r in zip(texts, reports)
        ]
        replies = generator.generate([(judge, q) for q in prompts], 1, 0)
        found = [_SCORE.search(g[0].text) for g in replies]
        return [min(10.0, float(m.group())) if m else 0.0 for m in found]

    return scores


def public_report(node_data: Mapping[str, Any]) -> str:
    """`passed 75% of them` and the error feedback, as the judge reads a candidate's public tests."""
    text = f"passed {node_data['fractions']['public']:.0%} of them"
    return f"{text}\n{node_data['feedback']}" if node_data.get("feedback") else text


class DepthGamma(StrictModel):
    """gamma(d) = max(floor, start - step * d)."""

    start: float = Field(0.98, gt=0, le=1)
    step: float = Field(0.05, ge=0)
    floor: float = Field(0.5, gt=0, le=1)


class Mars2Config(BaseWorkflowConfig):
    """MARS2 tree search as the environment; MARS2-T+ search at evaluation."""

    kind: Literal["mars2"] = "mars2"
    agents: list[str] | None = Field(None, min_length=1, description="the team, in order; None: every agent")
    max_nodes: int = Field(8, ge=2, description="nodes per tree")
    expansions_per_round: int = Field(2, ge=1, description="expansions per tree between generator calls")
    prior: Literal["uniform", "reward_average"] = "uniform"
    prior_strength: float = Field(1.0, gt=0, description="a0 + b0 of the reward_average prior")
    depth_gamma: list[float] | DepthGamma = Field(
        default_factory=DepthGamma, description="gamma(d): per-depth list (last repeats) or a rule"
    )
    use_feedback: bool = Field(True, description="refinement prompts carry public-test error feedback")
    stop_on_solve: bool = Field(True, description="stop a tree once a node passes all tests")
    reward: RewardKind = Field(
        "fraction", description="node reward: fraction of tests passed, or 1 only when all pass"
    )
    normalization: Literal["tree", "agent", "kind"] = Field(
        "tree",
        description="tree: one advantage group per tree (MARS2); agent: per agent inside each tree "
        "(Dr. MAS); kind: fresh solutions and refinements of a tree in separate groups",
    )
    select: Literal["public_score", "reward_model"] = Field(
        "public_score",
        description="T+ final answer: best public score, or the judge's (else the reward_model hook's) score",
    )
    judge: str | None = Field(
        None, description="agent that scores T+'s candidates when select is reward_model"
    )
    ties: Literal["earliest", "latest"] = Field(
        "earliest", description="T+ final answer among equal scores: the earliest node, or the latest (MARTI)"
    )
    # MARS2-T+: the same tree search at test time, on public tests, scored on private ones
    eval_search: bool = Field(False, description="also run MARS2-T+ search at evaluation")
    eval_max_nodes: int | None = Field(None, ge=2, description="T+ nodes per tree; None: max_nodes")
    # greedy decoding (evaluation's default) makes every fresh node of one agent the same program: a
    # search over copies, which flatters teams of several models over a single agent
    eval_search_sampling: Literal["train", "eval"] = Field(
        "train",
        description="sampling of T+ search: the training sampling (sampler and agents' sampling) or eval_sampling",
    )

    @field_validator("depth_gamma")
    @classmethod
    def _gamma_values(cls, v):
        if isinstance(v, list):
            make_gamma(v)  # raises for an empty list or values outside (0, 1]
        return v

    def check_agents(self, agents: Mapping[str, Any]):
        found = []
        for i, name in enumerate(self.agents or ()):
            if name not in agents:
                found.append((("agents", i), f"unknown agent; known: {', '.join(agents)}", name))
            elif name in self.agents[:i]:
                found.append((("agents", i), "agent listed twice", name))
        if self.judge is not None and self.judge not in agents:
            found.append((("judge",), f"unknown agent; known: {', '.join(agents)}", self.judge))
        return found


def split_fractions(score: Score) -> dict[str, float]:
    """Reward on all / public / private tests. Math (no tests) uses the answer check for all three;
    without private tests "private" means all tests; without public tests "public" is 0."""
    res = score.result
    if res is None:
        return {"all": score.reward, "public": score.reward, "private": score.reward}
    splits = {t.split for t in res.tests}
    return {
        "all": res.pass_fraction(),
        "public": res.pass_fraction("public"),
        "private": res.pass_fraction("private" if "private" in splits else None),
    }


def _own_paragraph(template: str, slot: str, text: str) -> str:
    """`text` for the template's `{slot}`, starting a paragraph of its own where the template puts
    the slot right after another one (`{problem}{feedback}`: the problem ends with a sentence);
    text the template writes before a slot (`<F>{feedback}`) is the template's own separator."""
    for literal, name, _, _ in string.Formatter().parse(template):
        if name == slot and text and not literal:
            return "\n\n" + text
    return text


def refine_prompt(agent: Agent, problem: Problem, code: str, feedback: str) -> str:
    """The CONT prompt: problem, previous program, feedback. Placed in the template's {history} /
    {feedback} slots when it has them, else appended to the problem text."""
    history = (
        f"Previous attempt:\n{code}" if problem.is_math else f"Previous attempt:\n```python\n{code}\n```"
    )
    fb = f"Feedback on the public tests:\n{feedback}" if feedback else ""
    fields = template_fields(agent.template)
    parts = (
        [problem.prompt]
        + ([history] if "history" not in fields else [])
        + ([fb] if fb and "feedback" not in fields else [])
        + [REFINE_NOTE]
    )
    return agent.render(
        "\n\n".join(parts),
        feedback=_own_paragraph(agent.template, "feedback", fb),
        history=_own_paragraph(agent.template, "history", history),
    )


def run_search(
    problems: Sequence[Problem],
    team: Sequence[Agent],
    generator: Generator,
    verifier: Verifier,
    seed: int,
    search: Mars2Config,
    priors: Mapping[str, tuple[float, float]] | None = None,
    split: str = "all",
    progress: Callable[[int], None] | None = None,
) -> tuple[list[Tree], int]:
    """Grow one tree per problem with `search`'s options; node rewards are the `split` ("all" or
    "public") pass fraction. Returns the trees and the number of generator rounds. `progress(n)`
    hears after each round how many more trees are done (the calls add up to the problem count)."""
    by_name = {a.name: a for a in team}
    gamma = make_gamma(search.depth_gamma)
    trees = [Tree(list(by_name), search.max_nodes, priors, gamma, search.stop_on_solve) for _ in problems]
    rng = np.random.default_rng(seed)
    finished = 0
    for rnd in itertools.count():
        pending = [
            (i, n) for i, t in enumerate(trees) for n in t.plan_round(rng, search.expansions_per_round)
        ]
        if not pending:
            return trees, rnd
        prompts = []
        for i, n in pending:
            agent, p = by_name[n.agent], problems[i]
            if n.kind == CONT:
                parent = trees[i].nodes[n.parent].data
                prompts.append(refine_prompt(agent, p, parent["code"], parent["feedback"]))
            else:
                prompts.append(agent.render(p.prompt))
        # One call for every pending node of every tree: the generator batches per policy.
        gens = generator.generate(
            [(by_name[n.agent], q) for (_, n), q in zip(pending, prompts)], 1, derive_seed(seed, rnd, "round")
        )
        texts = [g[0].text for g in gens]
        scores = verifier.score([problems[i] for i, _ in pending], texts)
        for (i, n), g, text, s, q in zip(pending, gens, texts, scores, prompts):
            frac = split_fractions(s)
            fb = error_feedback(s.result) if search.use_feedback and s.result is not None else ""
            code = text if problems[i].is_math else extract_code(text).code
            trees[i].record(
                n,
                as_reward(frac[split], search.reward),
                frac[split] >= 1.0,
                gen=g[0],
                text=text,
                code=code,
                feedback=fb,
                fractions=frac,
                prompt=q,
            )
        if progress is not None:
            now = sum(t.done for t in trees)
            progress(now - finished)
            finished = now


def search_eval(
    problems: Sequence[Problem],
    agents: Sequence[Agent] | Mapping[str, Agent],
    generator: Generator,
    verifier: Verifier,
    *,
    max_nodes: int,
    expansions_per_round: int = 1,
    depth_gamma: list[float] | DepthGamma | None = None,
    stop_on_solve: bool = True,
    priors: Mapping[str, tuple[float, float]] | None = None,
    reward_model: RewardModel | None = None,
    ties: str = "earliest",
    seed: int = 0,
    use_feedback: bool = True,
    progress: Callable[[int], None] | None = None,
) -> dict[str, float]:
    """MARS2-T+: search with error feedback on public-test rewards, pick one answer per problem
    (best public score, or `reward_model`'s; `ties` to the earliest or latest node), score it on
    the private tests. `use_feedback=False` leaves the feedback out of refinement prompts (the
    ablation of MARS2-T+'s error feedback); `depth_gamma=[1.0]` turns depth guidance off.
    `progress(n)`: `n` more problems' trees are done, after each round (see `run_search`).

    pass_at_1: the chosen answer passes all private tests; oracle: some node does; gen_success and
    cont_success: the share of fresh solutions and of refinements that pass all private tests
    (left out where the trees hold none of that kind)."""
    team = list(agents.values()) if isinstance(agents, Mapping) else list(agents)
    gamma = {} if depth_gamma is None else {"depth_gamma": depth_gamma}
    search = Mars2Config(
        max_nodes=max_nodes,
        expansions_per_round=expansions_per_round,
        use_feedback=use_feedback,
        stop_on_solve=stop_on_solve,
        reward="fraction",
        **gamma,
    )
    trees, rounds = run_search(
        problems, team, generator, verifier, seed, search, priors, split="public", progress=progress
    )
    chosen, passed, oracle = [], [], []
    for p, t in zip(problems, trees):
        scores = None
        if reward_model is not None:
            texts, reports = [n.data["text"] for n in t.nodes], [public_report(n.data) for n in t.nodes]
            scores = list(reward_model(p, texts, reports))
        best = select_final(t.nodes, scores, ties)
        chosen.append(best.agent)
        passed.append(best.data["fractions"]["private"] >= 1.0)
        oracle.append(any(n.data["fractions"]["private"] >= 1.0 for n in t.nodes))
    out = {
        "eval/search/pass_at_1": float(np.mean(passed)),
        "eval/search/oracle": float(np.mean(oracle)),
        "eval/search/nodes": float(np.mean([len(t.nodes) for t in trees])),
        "eval/search/rounds": float(rounds),
    }
    nodes = [n for t in trees for n in t.nodes]
    for kind in (GEN, CONT):
        mine = [n.data["fractions"]["private"] >= 1.0 for n in nodes if n.kind == kind]
        out[f"eval/search/{kind}_nodes"] = len(mine) / len(trees)
        if mine:
            out[f"eval/search/{kind}_success"] = float(np.mean(mine))
    for a in team:
        out[f"eval/search/{a.name}/nodes"] = float(
            np.mean([sum(n.agent == a.name for n in t.nodes) for t in trees])
        )
        out[f"eval/search/{a.name}/chosen"] = float(np.mean([c == a.name for c in chosen]))
    return out


@register_workflow("mars2")
class Mars2Workflow(Workflow[Mars2Config]):
    """MARS2 training environment; `reward_model` is the optional T+ answer-selection hook."""

    reward_model: RewardModel | None = None  # set on an instance to use select: reward_model

    @functools.cached_property
    def averages(self) -> RewardAverage:
        """Each agent's running average reward across steps (the reward_average prior's mean)."""
        return RewardAverage()

    def _team(self, agents: Mapping[str, Agent]) -> list[Agent]:
        names = self.cfg.agents if self.cfg.agents is not None else sorted(agents)
        missing = [n for n in names if n not in agents]
        if missing:
            raise ValueError(f"unknown agents {missing}; known: {sorted(agents)}")
        return [agents[n] for n in names]

    def priors(self, team: Sequence[Agent]) -> dict[str, tuple[float, float]] | None:
        if self.cfg.prior == "uniform":
            return None
        return {a.name: self.averages.prior(a.name, self.cfg.prior_strength) for a in team}

    def play(
        self,
        problems: Sequence[Problem],
        agents: Mapping[str, Agent],
        generator: Generator,
        verifier: Verifier,
        seed: int,
    ) -> Episodes:
        team = self._team(agents)
        trees, rounds = run_search(problems, team, generator, verifier, seed, self.cfg, self.priors(team))
        index = {a.name: k for k, a in enumerate(team)}
        episodes = Episodes(len(problems), reward_dtype=np.float32)
        for i, t in enumerate(trees):
            for n in t.nodes:
                episodes.add(
                    n.data["gen"],
                    problem=problems[i].id,
                    episode=i,
                    node=n.index,
                    parent=n.parent,
                    depth=n.depth,
                    turn=n.index,
                    reward=n.reward,
                    passed=n.solved,
                    agent=index[n.agent],
                )
        episodes.context.update(team=team, trees=trees)
        extras = episodes.extras
        extras["mars2/nodes_per_tree"] = float(np.mean([len(t.nodes) for t in trees]))
        extras["mars2/solved"] = float(np.mean([t.solved for t in trees]))
        extras["mars2/max_depth"] = float(np.mean([max(n.depth for n in t.nodes) for t in trees]))
        extras["mars2/rounds"] = float(rounds)
        return episodes

    def credit(self, episodes: Episodes):
        """One advantage group per tree (or per agent inside it); the shaped rewards also feed each
        agent's running average (the `reward_average` prior) and its metrics."""
        team, trees = episodes.context["team"], episodes.context["trees"]
        if self.cfg.normalization == "agent":
            advantages = agentwise_advantages(episodes, len(team), "episode", len(trees))
        elif self.cfg.normalization == "kind":  # group 2t: tree t's fresh nodes, 2t + 1: its refinements
            groups = 2 * episodes.array("episode") + (episodes.array("parent") >= 0)
            advantages = kernels.mars2_advantages(episodes.array("reward"), groups, num_trees=2 * len(trees))
        else:
            rewards, tree_ids = episodes.array("reward"), episodes.array("episode")
            advantages = kernels.mars2_advantages(rewards, tree_ids, num_trees=len(trees))
        nodes = [n for t in trees for n in t.nodes]
        for n, r in zip(nodes, episodes["reward"]):
            self.averages.add(n.agent, float(r))
        extras = episodes.extras
        for a in team:
            mine = [n for n in nodes if n.agent == a.name]
            extras[f"agent/{a.name}/nodes"] = len(mine) / len(trees)
            if mine:
                extras[f"agent/{a.name}/refine_frac"] = float(np.mean([n.kind == CONT for n in mine]))
                extras[f"agent/{a.name}/prior_mean"] = self.averages.mean(a.name)
        return advantages

    def evaluate(
        self,
        problems: Sequence[Problem],
        agents: Mapping[str, Agent],
        generator: Generator,
        verifier: Verifier,
        train_generator: Generator | None = None,
    ) -> dict[str, float]:
        """Single-shot pass@1 per agent on all tests (`generator`: evaluation's sampling, greedy by
        default); with `eval_search`, MARS2-T+ as well, sampled by `train_generator` (the training
        sampling, where given) unless `eval_search_sampling` is "eval"."""
        c, team, P = self.cfg, self._team(agents), len(problems)
        gens = generator.generate([(a, a.render(p.prompt)) for a in team for p in problems], 1, 0)
        scores = verifier.score([p for _ in team for p in problems], [g[0].text for g in gens])
        out = {}
        for j, a in enumerate(team):
            mine = scores[j * P : (j + 1) * P]
            out[f"eval/{a.name}/pass_at_1"] = float(np.mean([s.passed for s in mine]))
            out[f"eval/{a.name}/reward"] = float(np.mean([s.reward for s in mine]))
        if c.eval_search:
            reward_model = None
            if c.select == "reward_model":
                reward_model = judge_model(agents[c.judge], generator) if c.judge else self.reward_model
                if reward_model is None:
                    raise ValueError(
                        "select='reward_model' needs workflow.judge (an agent) or the reward_model hook"
                    )
            out.update(
                search_eval(
                    problems,
                    team,
                    train_generator if c.eval_search_sampling == "train" and train_generator else generator,
                    verifier,
                    max_nodes=c.eval_max_nodes or c.max_nodes,
                    expansions_per_round=c.expansions_per_round,
                    depth_gamma=c.depth_gamma,
                    stop_on_solve=c.stop_on_solve,
                    priors=self.priors(team),
                    seed=0,
                    reward_model=reward_model,
                    ties=c.ties,
                )
            )
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"reward_average": self.averages.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.averages.load_state_dict(state.get("reward_average", {}))
