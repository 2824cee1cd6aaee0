"""What the tool tasks are scored and helped with (the tasks themselves are made in `marljax.tasks`).

* `qa_score`, `numeric_score`: exact match or token F1 over a QA problem's answers; the last
  number of an answer against a ``math`` problem's.
* `grid_checker_tool`: for the grid game of `marljax.envs.grid`, a tool that runs a move string
  and says where it ends (no solver: the agent still has to find the path).
* `problem_passages`: the passages a problem carries, for a search tool over them alone.
"""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Sequence

from marljax.envs.grid import bfs_distances, parse_moves, run_plan
from marljax.envs.search import Passage
from marljax.envs.tools import Tool
from marljax.rewards import Problem


# ------------------------------------------------------------------ answer scores
def normalize_answer(text: str) -> str:
    """Lower case, no punctuation, no articles, single spaces (the SQuAD / HotpotQA normalisation)."""
    text = "".join(ch for ch in text.lower() if ch not in string.punctuation)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def token_f1(prediction: str, reference: str) -> float:
    """F1 of the normalised tokens of `prediction` against `reference`."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(reference).split()
    common = sum((collections.Counter(pred) & collections.Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def qa_answers(problem: Problem) -> list[str]:
    return [str(a) for a in problem.fields["answers"]]


def qa_score(problem: Problem, answer: str, metric: str = "em") -> float:
    """Best exact match (1 or 0) or token F1 of `answer` over the problem's accepted answers."""
    refs = qa_answers(problem)
    if metric == "em":
        return float(any(normalize_answer(answer) == normalize_answer(r) for r in refs))
    if metric == "f1":
        return max(token_f1(answer, r) for r in refs)
    raise ValueError(f"unknown QA metric {metric!r}; known: em, f1")


def numeric_score(problem: Problem, answer: str) -> float:
    """1 when the last number in `answer` equals the problem's answer (commas allowed), else 0."""
    numbers = re.findall(r"-?\d[\d,]*(?:\.\d+)?", answer)
    if not numbers:
        return 0.0
    try:
        return float(float(numbers[-1].replace(",", "")) == float(problem.fields["answer"]))
    except ValueError:
        return 0.0


# ------------------------------------------------------------------ the grid with a checker
def grid_checker_tool(problem: Problem, pos: Sequence[int] | None = None, timeout_s: float = 2.0) -> Tool:
    """`check_plan(moves)` on one grid from `pos` (default: its start): where the moves end, whether
    a move hit a wall or the edge, and how far the end is from the goal. It checks, it does not plan."""
    fields = problem.fields
    start = fields["start"] if pos is None else pos

    def check_plan(moves: str) -> str:
        plan = parse_moves(f"Moves: {moves}")
        res = run_plan(fields, start, plan)
        if res.reached:
            return f"reaches the goal after {res.used} moves"
        stop = f"move {res.used + 1} ({plan[res.used]}) hits a wall or the edge; " if res.illegal else ""
        d = bfs_distances(fields)[res.pos]
        return f"{stop}ends at row {res.pos[0]}, column {res.pos[1]}, {d} moves from the goal"

    return Tool(
        "check_plan",
        "Run a move string (U/D/L/R) from the start and see where it ends.",
        {"moves": "string"},
        check_plan,
        timeout_s,
    )


def problem_passages(problem: Problem) -> list[Passage]:
    """The passages a QA problem carries (``fields["passages"]``: ``[[title, text], ...]``)."""
    rows = problem.fields.get("passages")
    if not rows:
        raise ValueError(f"{problem.source}: problem {problem.id!r} carries no passages to search")
    return [Passage(f"{problem.id}/{k}", str(t), str(x)) for k, (t, x) in enumerate(rows)]
