"""Every workflow kind prompts its agents through the tokenizer's chat template (one training step of
each shipped tiny config, read back from the rollout log: what the sampler was given), none with
`chat: off`, and adds DAPO's overlong penalty to each completion's reward when `workflow.overlong`
is set."""

from __future__ import annotations

from pathlib import Path

import pytest

from marljax.train import rollout_log
from marljax.train.config import load_config
from marljax.workflows import REGISTRY

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
# the tiny configs on random presets (with the chat template of their built-in tokenizer); not those
# whose model a command writes first (the `*_sft_tiny` teams: raw-text models, `chat: off`)
TINY = [
    p
    for p in sorted(CONFIGS.glob("*_tiny.yaml"))
    if all(policy.model.preset for policy in load_config(p, [f"run_dir={p}"]).policies.values())
]
QUICK = [
    "train.steps=1",
    "train.log_rollouts=1",
    "train.log_to=[]",
    "train.progress=false",
    "sampler.max_new_tokens=8",
    "data.batch_size=1",
]
OVERLONG = ["workflow.overlong.max_len=2", "workflow.overlong.buffer_len=1", "workflow.overlong.factor=10"]


def logged_step(path: Path, run_dir: Path, extra: list[str] = ()) -> tuple[list[dict], dict]:
    """One training step of `path`'s config: the rollout log's records and the step's metrics."""
    from marljax.train.loop import Trainer

    trainer = Trainer(load_config(path, [f"run_dir={run_dir}", *QUICK, *extra]))
    try:
        metrics = trainer.train_step()
    finally:
        trainer.close()
    return rollout_log.read_step(run_dir, 1), metrics


def test_the_tiny_configs_cover_every_workflow_kind():
    kinds = {load_config(p, [f"run_dir={p}"]).workflow.kind for p in TINY}
    assert kinds == set(REGISTRY)


@pytest.mark.slow
@pytest.mark.parametrize("path", TINY, ids=[p.stem for p in TINY])
def test_every_agent_prompt_is_in_chat_form(path, tmp_path):
    """The chat markup, and DAPO's overlong penalty (each workflow adds it in its own rewards):
    -10 for every completion of 2 tokens or more."""
    cfg = load_config(path, [f"run_dir={tmp_path}"])
    records, metrics = logged_step(path, tmp_path / "chat", OVERLONG)
    assert records
    for r in records:
        prompt, agent = r["prompt"], cfg.agents[r["agent"]]
        assert prompt.startswith("<|im_start|>") and prompt.endswith("<|im_start|>assistant\n"), prompt
        assert prompt.count("<|im_start|>system\n") == (1 if agent.role and "{role}" in agent.template else 0)
        if agent.role:
            assert agent.role.strip() in prompt
    long = [r for r in records if r["completion_len"] >= 2]
    assert long and all(r["reward"] < -5 for r in long), [(r["agent"], r["reward"]) for r in long]
    assert metrics["overlong/frac_penalized"] == pytest.approx(len(long) / len(records))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mars2_tiny", "sharp_tools_tiny"])
def test_chat_off_prompts_carry_no_markup(name, tmp_path):
    """`chat: off` is a policy setting that every workflow's prompts go through (one plain and one
    tool workflow here)."""
    path = CONFIGS / f"{name}.yaml"
    cfg = load_config(path, [f"run_dir={tmp_path}"])
    records, _ = logged_step(path, tmp_path / "raw", [f"policies.{p}.chat=off" for p in cfg.policies])
    assert records
    for r in records:
        assert "<|im_start|>" not in r["prompt"] and "<|im_end|>" not in r["prompt"], r["prompt"]
