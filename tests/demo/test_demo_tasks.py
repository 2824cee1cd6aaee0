"""The demo's "steps" tasks, its sloppy SFT teacher and the broken attempts of its refinement warm start."""

import random

import numpy as np
import pytest

from marljax.demo.models import steps_problems
from marljax.demo.refine import break_program, refine_examples
from marljax.rewards import Limits, run_many
from marljax.tasks import make_step_task
from marljax.workflows.base import Agent


def test_step_tasks_state_every_operation_and_their_references_pass():
    t = make_step_task(7, 3)
    assert t == make_step_task(7, 3) and t != make_step_task(8, 3)
    # one phrase per operation in the prompt, one "x = ..." line per operation in the reference
    phrases = t.prompt.split("; return x.")[0].count(", then ") + 1
    assert t.reference.count("\n    x = ") == phrases
    tasks = [make_step_task(k, steps) for k in range(12) for steps in (1, 3)]
    res = run_many([t.program(t.reference) for t in tasks], limits=Limits(test_timeout_s=5))
    assert all(r.passed for r in res)

    # hand-checked task: "multiply x by 3, then add 2" on x = 4 gives 14
    def apply(src, x):
        scope = {}
        exec(src, scope)  # our own reference, not generated text
        return scope["f"](x)

    assert apply("def f(x):\n    x = x * 3\n    x = x + 2\n    return x\n", 4) == 14
    for args, out in t.public + t.private:
        assert apply(t.reference, *args) == out
    with pytest.raises(ValueError):
        make_step_task(0, 0)


def test_broken_attempts_fail_and_refinement_pairs_carry_real_feedback():
    from marljax.rewards import SandboxPool

    problems = steps_problems(12, seed=3, steps=2)
    rng = random.Random(0)
    for p in problems:
        for names in (False, True):
            assert break_program(p.fields["solution"], rng, names) != p.fields["solution"]
    with SandboxPool(max_workers=2) as pool:
        pairs = refine_examples(problems, Agent("a", "p"), pool, seed=0)
    assert len(pairs) >= 9  # a changed constant can occasionally still pass; those are dropped
    by_prompt = {p.prompt: p for p in problems}
    for prompt, target in pairs:
        problem = next(q for text, q in by_prompt.items() if prompt.startswith(text))
        assert "Previous attempt:" in prompt and "Feedback on the public tests:" in prompt
        assert target == f"```python\n{problem.fields['solution'].rstrip()}\n```"
        attempt = prompt.split("```python\n")[1].split("```")[0]
        assert attempt != problem.fields["solution"]


def test_teacher_slips_at_its_rate_and_every_slipped_program_fails():
    from marljax.demo.teacher import slip, teacher_completion
    from marljax.rewards import SandboxPool, score_texts
    from marljax.train.sft import reference_completion

    by_hand = {
        "x = x // 3": "x = x / 3",
        "x = x - 4": "x = 4 - x",
        "x = max(x, 5)": "x = min(x, 5)",
        "x = min(x, 5)": "x = max(x, 5)",
        "x = x * 3": "x = x ** 3",
        "x = x % 7": "x = x // 7",
        "x = x * x": "x = x * 2",
        "x = abs(x)": "x = -x",
        "x = x + 2": "x = x + 2",
    }
    for line, wrong in by_hand.items():
        assert (
            slip(f"def f(x):\n    {line}\n    return x\n", random.Random(0), 1.0)
            == f"def f(x):\n    {wrong}\n    return x\n"
        )

    problems = steps_problems(160, seed=11, steps=1)
    code = [p.fields["solution"] for p in problems]
    slippable = ["x = x + " not in c for c in code]  # adding is the one step without a slip
    assert all(teacher_completion(p, 0.0) == reference_completion(p) for p in problems)
    always = [teacher_completion(p, 1.0) for p in problems]
    assert [a != reference_completion(p) for a, p in zip(always, problems)] == slippable
    half = [teacher_completion(p, 0.5, seed=4) for p in problems]
    assert half == [teacher_completion(p, 0.5, seed=4) for p in problems]  # the same answer every time
    changed = [h != reference_completion(p) for h, p, s in zip(half, problems, slippable) if s]
    assert abs(np.mean(changed) - 0.5) < 4 * 0.5 / np.sqrt(len(changed)), np.mean(changed)  # 4 sigma
    with SandboxPool(max_workers=2) as pool:
        scores = score_texts(problems, always, pool)
    assert [not s.passed for s in scores] == slippable  # every slip is caught by the task's tests


def test_the_code_teacher_reads_the_task_from_any_prompt_that_states_it():
    """`code_teacher` (a `train.sft_teacher` script) writes the reference program of the steps task
    a prompt states, wherever it stands (a first attempt's prompt or a refinement's), slipped at its
    rate and drawn anew for every call."""
    from marljax.demo.teacher import code_teacher
    from marljax.tasks.code import step_reference
    from marljax.train.sft import reference_completion

    tasks = [make_step_task(seed, steps=4) for seed in range(200)]
    assert all(step_reference(t.prompt) == t.reference for t in tasks)  # read back exactly
    assert step_reference("Write f(x): fly to the moon; return x.") is None
    assert step_reference("no task here") is None
    problems = steps_problems(200, seed=3, steps=1)
    exact = code_teacher(0.0)
    refine = "{}\n\nPrevious attempt:\n```python\ndef f(x):\n    return x\n```\n\nFix it."
    assert all(exact(None, refine.format(p.prompt), 0, 0) == reference_completion(p) for p in problems)
    sloppy = code_teacher(0.5, seed=1)
    slippable = [p for p in problems if "x = x + " not in p.fields["solution"]]
    twice = [(sloppy(None, p.prompt, 0, 0), sloppy(None, p.prompt, 0, 0)) for p in slippable]
    slipped = [a != reference_completion(p) for (a, _), p in zip(twice, slippable)]
    assert abs(np.mean(slipped) - 0.5) < 4 * 0.5 / np.sqrt(len(slipped))  # 4 sigma
    assert any(a != b for a, b in twice)  # each call draws its own slips
    with pytest.raises(ValueError, match="no steps task"):
        exact(None, "Write a haiku.", 0, 0)
