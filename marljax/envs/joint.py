"""MAGRPO's tasks: what each agent is asked, and how the team's joint answer is judged.

A joint answer is one text per agent, in the workflow's agent order. `judge`
scores a batch of joint answers at once and returns, for each, the joint
reward, whether it passed every test and the feedback the next turn's prompts
carry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

from marljax.envs import coop_code
from marljax.rewards import Problem, Verifier, error_feedback


@dataclasses.dataclass(frozen=True)
class Judgement:
    reward: float
    passed: bool
    feedback: str


class JointTask(Protocol):
    def problem_text(self, problem: Problem, agent_index: int) -> str:
        """The `{problem}` text of agent `agent_index`'s prompt."""

    def judge(
        self, problems: Sequence[Problem], answers: Sequence[Sequence[str]], verifier: Verifier
    ) -> list[Judgement]:
        """The judgement of each joint answer `answers[i]` to `problems[i]`."""


class CoopCodeTask:
    """Helper + main write one program together (`marljax.envs.coop_code`'s level reward)."""

    def problem_text(self, problem: Problem, agent_index: int) -> str:
        return coop_code.helper_prompt(problem) if agent_index == 0 else coop_code.main_prompt(problem)

    def judge(
        self, problems: Sequence[Problem], answers: Sequence[Sequence[str]], verifier: Verifier
    ) -> list[Judgement]:
        scores = coop_code.score_pairs(problems, [a[0] for a in answers], [a[1] for a in answers], verifier)
        return [Judgement(s.reward, s.passed, s.feedback) for s in scores]


class LastAnswerTask:
    """Every agent sees the problem; the last agent's answer is scored (tests or the math answer)."""

    def problem_text(self, problem: Problem, agent_index: int) -> str:
        return problem.prompt

    def judge(
        self, problems: Sequence[Problem], answers: Sequence[Sequence[str]], verifier: Verifier
    ) -> list[Judgement]:
        scores = verifier.score(problems, [a[-1] for a in answers])
        return [
            Judgement(
                s.reward,
                s.passed,
                error_feedback(s.result)
                if s.result is not None
                else ("" if s.passed else "The answer is incorrect."),
            )
            for s in scores
        ]


TASKS: dict[str, type[JointTask]] = {"coop_code": CoopCodeTask, "score": LastAnswerTask}
