"""The scores of the tool tasks (exact match, token F1, numbers) and the grid checker tool."""

from __future__ import annotations

import pytest

from marljax.envs.tasks import grid_checker_tool, normalize_answer, qa_score, token_f1
from marljax.tasks import make_grid_problems, make_multihop


def test_qa_scores():
    assert normalize_answer("The  Republic of Kalo!") == "republic of kalo"
    assert token_f1("Kalo Ra", "Kalo") == pytest.approx(2 * 0.5 * 1 / 1.5)
    assert token_f1("x", "y") == 0.0
    problems, _ = make_multihop(1)
    answer = problems[0].fields["answers"][0]
    assert qa_score(problems[0], f"the {answer.lower()}.") == 1.0
    assert qa_score(problems[0], f"{answer} city") == 0.0
    assert qa_score(problems[0], f"{answer} city", "f1") == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="unknown QA metric"):
        qa_score(problems[0], "", "bleu")


def test_grid_checker_reports_without_solving():
    grid = make_grid_problems(1, seed=0)[0]
    tool = grid_checker_tool(grid)
    assert tool.fn(moves=grid.fields["solution"]) == f"reaches the goal after {grid.fields['distance']} moves"
    r, c = grid.fields["start"]
    assert tool.fn(moves="") == f"ends at row {r}, column {c}, {grid.fields['distance']} moves from the goal"
    # walking off the top edge: as many U moves as rows above, plus one
    text = tool.fn(moves="U" * (r + 1))
    assert "hits a wall or the edge" in text
