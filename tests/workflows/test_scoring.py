"""score_texts: every distinct (problem, program) runs once in the sandbox; repeats share its verdict."""

from marljax.demo.models import steps_problems
from marljax.rewards import SandboxPool
from marljax.workflows.scoring import score_texts


class CountingPool(SandboxPool):
    """The real pool, counting the programs it is given."""

    submitted: list

    def submit(self, program, limits=None):
        self.submitted.append(program.code)
        return super().submit(program, limits)


def test_repeated_programs_run_once_and_share_their_verdict():
    a, b = steps_problems(2, seed=3, steps=1)
    good_a, good_b = (f"```python\n{p.fields['solution']}\n```" for p in (a, b))
    bad = "```python\ndef f(x):\n    return None\n```"
    problems = [a, a, a, a, b, b]
    texts = [good_a, bad, good_a, "Here it is:\n" + good_a, good_b, bad]  # the fourth has good_a's code
    with CountingPool(max_workers=2) as pool:
        pool.submitted = []
        scores = score_texts(problems, texts, pool)
        assert len(pool.submitted) == 4  # (a, good), (a, bad), (b, good), (b, bad)
        alone = [score_texts([p], [t], pool)[0] for p, t in zip(problems, texts)]
    assert [s.passed for s in scores] == [True, False, True, True, True, False]
    assert [(s.reward, s.passed) for s in scores] == [(s.reward, s.passed) for s in alone]
