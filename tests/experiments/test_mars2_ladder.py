"""experiments/mars2_ladder.py without training: the teachers' habits and the summary statistics."""

from __future__ import annotations

import mars2_ladder as L
import pytest

from marljax.demo.models import steps_problems
from marljax.demo.teacher import SLIPS, habit_completion
from marljax.tasks.code import _STEPS


def test_habits_are_disjoint_and_name_the_teachers_slips():
    a, b = L.HABITS.values()
    assert not set(a) & set(b) and set(a) | set(b) == set(L.KINDS) and len(L.KINDS) == len(SLIPS)
    for kind in L.KINDS:  # each kind's task statement is caught by that kind's slip pattern
        assert L.line_kind(_STEPS[kind](3)[1]) == kind
    assert L.line_kind(_STEPS["add"](3)[1]) is None


def test_each_teacher_slips_on_its_own_kinds_only():
    problems = steps_problems(300, 123, 1)
    for family, kinds in L.HABITS.items():
        seen = set()
        for p in problems:
            ref, kind = p.fields["solution"], L.task_kind(p)
            text = habit_completion(p, kinds, rate=1.0)
            slipped = L.slipped_kinds(text, ref)
            # rate 1: every task of its own kinds slipped, every other task exactly the reference
            assert slipped == ([kind] if kind in kinds else []), (family, kind, text)
            if kind not in kinds:
                assert text == f"```python\n{ref.rstrip()}\n```"
            seen |= set(slipped)
        assert seen == set(kinds)
        # at the experiment's rate, about SLIP_RATE of its own kinds' tasks are slipped
        own = [p for p in problems if L.task_kind(p) in kinds]
        rate = sum(
            bool(L.slipped_kinds(habit_completion(p, kinds, L.SLIP_RATE), p.fields["solution"])) for p in own
        )
        assert abs(rate / len(own) - L.SLIP_RATE) < 0.1


def measurement(passed_q, passed_l, search, pass_k, distinct, slipped_q=None):
    policies = {"qwen3": {"greedy_passed": passed_q, "slipped": slipped_q or [[] for _ in passed_q]}}
    if passed_l is not None:
        policies["llama"] = {"greedy_passed": passed_l, "slipped": [[] for _ in passed_l]}
    return {
        "policies": policies,
        "pass_at_k": pass_k,
        "sample_pass_rate": pass_k / 2,
        "diversity/distinct_programs": distinct,
        "diversity/algorithmic_variety": distinct / 2,
        "search": {
            "eval/search/pass_at_1": search,
            "eval/search/oracle": search,
            "eval/search/alice/chosen": 1.0,
        },
    }


def test_summary_statistics_on_a_hand_made_input():
    kinds = ["floordiv", "min", None, "sub"]  # qwen3's, llama's, none, qwen3's
    runs = []
    for seed, (lo, hi) in enumerate(((0.2, 0.5), (0.3, 0.7), (0.4, 0.6))):
        for method, search in (("grpo", lo), ("mars2_homogeneous", lo), ("mars2_heterogeneous", hi)):
            hetero = method == "mars2_heterogeneous"
            before = measurement(
                [False, True, True, False],
                [True, False, True, True] if hetero else None,
                search,
                0.5,
                0.25,
                slipped_q=[["floordiv"], [], [], ["sub"]],
            )
            after = measurement(
                [True, True, True, False], [True] * 4 if hetero else None, search + 0.1, 0.75, 0.5
            )
            curve = [0.1 * seed, 0.2, 0.3][: 3 - (seed == 2)]  # a shorter curve: means over the common steps
            runs.append(
                {
                    "seed": seed,
                    "method": method,
                    "kinds": kinds,
                    "before": before,
                    "after": after,
                    "reward_curve": curve,
                }
            )
    s = L.summarise(runs)
    het = s["settings"]["mars2_heterogeneous"]
    assert het["reward_curve"] == pytest.approx([0.1, 0.2])
    assert het["search_pass_at_1"]["before"]["mean"] == pytest.approx(0.6)
    assert het["search_pass_at_1"]["gain"]["mean"] == pytest.approx(0.1)
    # 95% t interval of (0.5, 0.7, 0.6): half-width t(0.975, 2) * 0.1 / sqrt(3) = 4.303 * 0.0577
    assert het["search_pass_at_1"]["before"]["hi"] - 0.6 == pytest.approx(4.3027 * 0.1 / 3**0.5, rel=1e-3)
    assert het["greedy_pass_at_1/llama"]["after"]["mean"] == 1.0
    assert het["greedy_pass_at_1/qwen3"]["gain"]["mean"] == pytest.approx(0.25)
    # paired ladder differences: heterogeneous - homogeneous = (0.3, 0.4, 0.2)
    d = s["ladder"]["mars2_heterogeneous-mars2_homogeneous/search_pass_at_1/before"]
    assert d["mean"] == pytest.approx(0.3) and d["std"] == pytest.approx(0.1)
    assert s["ladder"]["mars2_homogeneous-grpo/search_pass_at_1/after"]["mean"] == pytest.approx(0.0)
    w = s["warm_errors"]
    assert w["qwen3"]["pass_on_qwen3_kinds"] == 0.0 and w["qwen3"]["pass_on_llama_kinds"] == 1.0
    assert w["llama"]["pass_on_llama_kinds"] == 0.0 and w["llama"]["pass_on_qwen3_kinds"] == 1.0
    assert w["qwen3"]["slip_rate"] == {"floordiv": 1.0, "min": 0.0, "sub": 1.0}
    assert w["failed_both"] == 0 and w["failed_jaccard"] == 0.0 and w["team_greedy_coverage"] == 1.0
