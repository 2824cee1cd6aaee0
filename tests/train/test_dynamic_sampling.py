"""DAPO's dynamic sampling: problems whose completions all have zero advantage are dropped and more
problems are rolled out until the batch is full or the rounds run out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from marljax.train.dynamic_sampling import collect
from marljax.workflows.types import Generation, Rollout


def rollout(advantages: dict[str, list[float]], extra: float = 0.0) -> Rollout:
    """Two or more completions per problem, with the given advantages (rewards: advantages + 1)."""
    ids = [{"problem": p} for p, adv in advantages.items() for _ in adv]
    adv = np.array([a for values in advantages.values() for a in values])
    gens = [Generation("x", np.array([1]), np.array([2]), np.zeros(1), agent="a", policy="p") for _ in ids]
    return Rollout(gens, ids, adv + 1, adv, np.zeros(len(ids)), {"team/reward": extra})


def problems_of(r: Rollout) -> list[str]:
    return list(dict.fromkeys(i["problem"] for i in r.ids))


def test_uninformative_problems_are_replaced_by_new_ones():
    first = rollout({"A": [0, 0], "B": [1, -1], "C": [0.5, -0.5]}, extra=1.0)
    calls = []

    def more(round_):
        calls.append(round_)
        return rollout({"D": [0, 0, 0], "E": [2, -2], "F": [1, -1]}, extra=3.0)

    out, metrics = collect(first, more, batch_size=3, max_rounds=3)
    assert calls == [1]
    assert problems_of(out) == ["B", "C", "E"]  # F is beyond the batch
    np.testing.assert_array_equal(out.advantages, [1, -1, 0.5, -0.5, 2, -2])
    np.testing.assert_array_equal(out.rewards, out.advantages + 1)
    assert out.extras == {"team/reward": 2.0}  # the mean over the rounds
    assert metrics == {
        "sampling/kept_problems": 3.0,
        "sampling/dropped_problems": 2.0,
        "sampling/rounds": 2.0,
    }


def test_the_rounds_run_out():
    first = rollout({"A": [0, 0], "B": [1, -1]})
    out, metrics = collect(first, lambda r: rollout({f"Z{r}": [0, 0]}), batch_size=2, max_rounds=3)
    assert problems_of(out) == ["B"]
    assert metrics == {
        "sampling/kept_problems": 1.0,
        "sampling/dropped_problems": 3.0,
        "sampling/rounds": 3.0,
    }
    # nothing informative at all: the first rollout stays (its update moves no weight)
    nothing = rollout({"A": [0, 0]})
    out, metrics = collect(nothing, lambda r: rollout({"B": [0, 0]}), batch_size=2, max_rounds=2)
    assert out is nothing and metrics["sampling/kept_problems"] == 0.0


@pytest.mark.slow
def test_the_trainer_rolls_out_more_problems(tmp_path):
    from marljax.train.config import load_config
    from marljax.train.loop import Trainer

    config = Path(__file__).resolve().parents[2] / "configs" / "grpo_tiny.yaml"
    quick = [
        "train.tensorboard=false",
        "train.progress=false",
        "sampler.max_new_tokens=8",
        "data.batch_size=2",
    ]
    cfg = load_config(
        config, [f"run_dir={tmp_path}", *quick, "train.dynamic_sampling=true", "train.max_sampling_rounds=3"]
    )
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
