"""DAPO's dynamic sampling: problems that teach nothing (by default: whose completions all passed or
all failed) are dropped and more problems are rolled out until the batch is full or the rounds run
out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from marljax.rewards import SandboxPool, SandboxVerifier
from marljax.tasks import parse_row
from marljax.train.config import ConfigError, config_from_dict, load_config
from marljax.train.config.schema import DynamicSamplingConfig
from marljax.train.dynamic_sampling import collect
from marljax.workflows.base import Agent, ScriptedGenerator
from marljax.workflows.grpo import GrpoWorkflow
from marljax.workflows.types import Generation, Rollout

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "grpo_tiny.yaml"
ADVANTAGE = DynamicSamplingConfig(keep="advantage")


def rollout(advantages: dict[str, list[float]], extra: float = 0.0, passed=None) -> Rollout:
    """Two or more completions per problem, with the given advantages (rewards: advantages + 1)
    and pass flags (default: 1 where the advantage is positive)."""
    ids = [{"problem": p} for p, adv in advantages.items() for _ in adv]
    adv = np.array([a for values in advantages.values() for a in values])
    gens = [Generation("x", np.array([1]), np.array([2]), np.zeros(1), agent="a", policy="p") for _ in ids]
    flags = (adv > 0) if passed is None else [f for p in advantages for f in passed[p]]
    return Rollout(gens, ids, adv + 1, adv, np.asarray(flags, float), {"team/reward": extra})


def problems_of(r: Rollout) -> list[str]:
    return list(dict.fromkeys(i["problem"] for i in r.ids))


def test_uninformative_problems_are_replaced_by_new_ones():
    first = rollout({"A": [0, 0], "B": [1, -1], "C": [0.5, -0.5]}, extra=1.0)
    calls = []

    def more(round_):
        calls.append(round_)
        return rollout({"D": [0, 0, 0], "E": [2, -2], "F": [1, -1]}, extra=3.0)

    out, sampled, metrics = collect(first, more, 3, ADVANTAGE)
    assert calls == [1]
    assert problems_of(out) == ["B", "C", "E"]  # F is beyond the batch
    np.testing.assert_array_equal(out.advantages, [1, -1, 0.5, -0.5, 2, -2])
    np.testing.assert_array_equal(out.rewards, out.advantages + 1)
    assert out.extras == {"team/reward": 2.0}  # the mean over the rounds
    assert problems_of(sampled) == ["A", "B", "C", "D", "E", "F"]
    assert metrics == {
        "sampling/kept_problems": 3.0,
        "sampling/dropped_problems": 2.0,
        "sampling/rounds": 2.0,
        "sampling/none_informative": 0.0,
        "sampling/skipped": 0.0,
    }


def test_a_group_is_kept_when_its_accuracy_varies():
    # A: both passed, advantages from a length penalty alone; B: one of two passed; C: both failed
    # with advantages from length; D: partial credit (passed fractions) that differ
    passed = {"A": [1, 1], "B": [1, 0], "C": [0, 0], "D": [0.5, 0.25]}
    first = rollout({"A": [1, -1], "B": [1, -1], "C": [-1, 1], "D": [0, 0]}, passed=passed)
    out, _, metrics = collect(first, None, 4, DynamicSamplingConfig(max_rounds=1))
    assert problems_of(out) == ["B", "D"]
    assert (metrics["sampling/kept_problems"], metrics["sampling/dropped_problems"]) == (2.0, 2.0)
    # the advantage filter keeps the length-only groups and drops D
    out, _, _ = collect(first, None, 4, DynamicSamplingConfig(keep="advantage", max_rounds=1))
    assert problems_of(out) == ["A", "B", "C"]


def test_the_rounds_run_out():
    first = rollout({"A": [0, 0], "B": [1, -1]})
    out, _, metrics = collect(first, lambda r: rollout({f"Z{r}": [0, 0]}), 2, DynamicSamplingConfig())
    assert problems_of(out) == ["B"]
    assert metrics["sampling/kept_problems"] == 1.0
    assert metrics["sampling/dropped_problems"] == 3.0
    assert metrics["sampling/rounds"] == 3.0


def test_when_no_round_teaches_the_step_is_skipped_or_trains_the_first_round():
    nothing = rollout({"A": [0.5, -0.5]}, passed={"A": [1, 1]})
    again = rollout({"B": [0, 0]}, passed={"B": [0, 0]})
    skip = DynamicSamplingConfig(max_rounds=2)
    out, sampled, metrics = collect(nothing, lambda r: again, 2, skip)
    assert out is None
    assert problems_of(sampled) == ["A", "B"]
    assert metrics["sampling/none_informative"] == metrics["sampling/skipped"] == 1.0
    train = DynamicSamplingConfig(max_rounds=2, when_none="train")
    out, sampled, metrics = collect(nothing, lambda r: again, 2, train)
    assert out is nothing and problems_of(sampled) == ["A", "B"]
    assert (metrics["sampling/none_informative"], metrics["sampling/skipped"]) == (1.0, 0.0)


ROW = {
    "task_id": "p0",
    "question": "Double x.",
    "fn_name": "f",
    "inputs": [[1], [2]],
    "outputs": [2, 4],
    "public": 1,
}
GOOD, BAD = "def f(x):\n    return 2 * x", "def f(x):\n    return x"


def test_dapo_overlong_penalty_does_not_keep_an_all_solved_group():
    """With DAPO's overlong penalty, GRPO gives an all-solved group advantages from length alone;
    the accuracy filter drops it, the trained rows are the mixed group's, and the logged reward is
    the mean over both groups."""
    solved, mixed = parse_row(ROW, "stdio", "<p0>:1"), parse_row({**ROW, "task_id": "p1"}, "stdio", "<p1>:1")
    padding = ["", "\n# " + "x" * 20, "\n# " + "x" * 40, ""]  # 26, 49, 69 and 22 bytes with BAD

    def script(agent, prompt, k, seed):
        return GOOD + padding[k] if seed == 0 else (GOOD if k < 2 else BAD)

    # two rounds: round 0 (seed 0) all solved at four lengths, round 1 two solved and two failed
    agents = {"solver": Agent("solver", "p")}
    wf = GrpoWorkflow(group_size=4, overlong={"max_len": 60, "buffer_len": 20, "factor": 1.0})
    with SandboxPool(max_workers=2) as pool:
        verifier = SandboxVerifier(pool)
        first = wf.rollout([solved], agents, ScriptedGenerator(script), verifier, 0)
        second = wf.rollout([mixed], agents, ScriptedGenerator(script), verifier, 1)
    # hand computed: round 0 rewards 1 + penalty, lengths 26, 49, 69, 26: penalties 0, -9/20, -1, 0
    np.testing.assert_allclose(first.rewards, [1, 0.55, 0, 1], atol=1e-6)
    np.testing.assert_array_equal(first.passed, [1, 1, 1, 1])
    assert np.abs(first.advantages).max() > 0.5  # length alone moves it
    np.testing.assert_allclose(second.rewards, [1, 1, 0, 0], atol=1e-6)

    out, sampled, metrics = collect(first, lambda r: second, 1, DynamicSamplingConfig())
    assert problems_of(out) == ["p1"]
    # rewards [1, 1, 0, 0]: mean 0.5, std (ddof 1) sqrt(1/3): advantages +-sqrt(3)/2
    np.testing.assert_allclose(out.advantages, np.array([1, 1, -1, -1]) * np.sqrt(3) / 2, atol=1e-4)
    assert sampled.metrics["agent/solver/reward"] == pytest.approx((2.55 + 2) / 8)
    assert sampled.metrics["agent/solver/pass_rate"] == pytest.approx(6 / 8)
    # the advantage filter trains the all-solved group
    out, _, _ = collect(first, lambda r: second, 1, ADVANTAGE)
    assert problems_of(out) == ["p0"]


def test_the_settings_are_checked():
    base = load_config(CONFIG).model_dump(mode="json")

    def train(**settings):
        return config_from_dict({**base, "train": {**base["train"], **settings}}).train

    assert train(dynamic_sampling=True).dynamic_sampling == DynamicSamplingConfig()
    assert train(dynamic_sampling=False).dynamic_sampling is None
    assert train(dynamic_sampling={"when_none": "train"}).dynamic_sampling.when_none == "train"
    for bad, key in [
        ({"keep": "reward"}, "train.dynamic_sampling.keep"),
        ({"when_none": "retry"}, "train.dynamic_sampling.when_none"),
        ({"max_rounds": 0}, "train.dynamic_sampling.max_rounds"),
        ({"rounds": 2}, "train.dynamic_sampling.rounds"),
    ]:
        with pytest.raises(ConfigError) as err:
            train(dynamic_sampling=bad)
        (line,) = err.value.problems
        assert f": {key}: " in line and "\n" not in line


@pytest.mark.slow
def test_the_trainer_rolls_out_more_problems(tmp_path):
    from marljax.train.loop import Trainer

    config = CONFIG
    quick = [
        "train.log_to=[]",
        "train.progress=false",
        "sampler.max_new_tokens=8",
        "data.batch_size=2",
    ]
    cfg = load_config(config, [f"run_dir={tmp_path}", *quick, "train.dynamic_sampling=true"])
    trainer = Trainer(cfg)
    try:
        metrics = trainer.train_step()
        state = trainer.stream.get_state()
    finally:
        trainer.close()
    rounds = metrics["sampling/rounds"]
    kept, dropped = metrics["sampling/kept_problems"], metrics["sampling/dropped_problems"]
    assert 1 <= rounds <= 3 and kept <= 2 and kept + dropped <= 2 * rounds
    assert rounds == 3 or kept == 2  # it stops early only with a full batch
    # the data stream moved by one batch per round
    plain = Trainer(load_config(config, [f"run_dir={tmp_path / 'plain'}", *quick]))
    try:
        for _ in range(int(rounds)):
            next(plain.stream)
        assert plain.stream.get_state() == state
    finally:
        plain.close()
