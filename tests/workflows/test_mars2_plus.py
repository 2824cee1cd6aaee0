"""configs/mars2_plus_tiny.yaml runs MARS2+ as its authors do (issue 42, item 1): several optimiser
steps per update so that GSPO's sequence clip can act, k3 KL to each agent's reference, full trees,
the fraction reward, one advantage group per tree, the overlong penalty."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from marljax.train.config import load_config
from marljax.train.policy import Policy
from marljax.workflows.types import Rows

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "mars2_plus_tiny.yaml"


@pytest.mark.parametrize("name", ["mars2_plus_tiny.yaml", "mars2_plus_qwen.yaml"])
def test_the_configs_ask_for_the_papers_recipe(name):
    cfg = load_config(CONFIG.parent / name)
    w = cfg.workflow
    assert (w.kind, w.normalization, w.reward, w.stop_on_solve) == ("mars2", "tree", "fraction", False)
    assert w.overlong is not None
    for policy in cfg.policies.values():
        loss = policy.loss
        assert (loss.type, loss.kl_coef, loss.kl_estimator) == ("gspo", 1e-3, "k3")
        assert policy.reference and policy.mini_batches >= 2


def rows(n: int = 8) -> Rows:
    rng = np.random.default_rng(0)
    return Rows(
        [rng.integers(3, 200, 6) for _ in range(n)],
        [rng.integers(3, 200, 5) for _ in range(n)],
        [np.full(5, -4.0, np.float32)] * n,
        advantage=list(rng.choice([-1.0, 1.0], n)),
        policy="coder_qwen",
    )


def test_its_sequence_clip_acts_where_one_step_per_update_leaves_every_ratio_at_one():
    cfg = load_config(CONFIG, ["policies.coder_qwen.micro_batch_size=4"])
    spec = cfg.policies["coder_qwen"]
    recipe = Policy("coder_qwen", spec).update(rows())
    one_step = Policy("coder_qwen", spec.model_copy(update={"mini_batches": 1})).update(rows())
    # one optimiser step: the "old" log-probs are the current parameters', the ratio exactly 1
    assert one_step["ratio_max"] == 1.0 and one_step["clip_frac"] == 0.0
    # two: the second mini-batch's ratios moved by the first step, past GSPO's 3e-4 / 4e-4 clip
    assert recipe["ratio_max"] != 1.0 and recipe["clip_frac"] > 0.0, recipe
    assert np.isfinite(recipe["kl_ref"])


def test_a_run_says_which_loss_and_credit_it_trains_with():
    from marljax.train.loop import recipe

    lines = recipe(load_config(CONFIG))
    assert lines[0] == (
        "policy coder_llama: loss gspo (seq-mean-token-mean), clip [0.0003, 0.0004], KL k3 0.001 to the "
        "reference, 2 optimiser step(s) per update, lr 0.001"
    )
    assert lines[-1] == (
        "workflow mars2: normalization=tree, reward=fraction, stop_on_solve=False, "
        "overlong={'max_len': 48, 'buffer_len': 16, 'factor': 1.0}"
    )
    # the plain MARS2 config: one step per update, no KL, early stop, stated as such
    plain = recipe(load_config(CONFIG.parent / "mars2_tiny.yaml"))
    assert "no KL, 1 optimiser step(s) per update" in plain[0] and "stop_on_solve=True" in plain[-1]
