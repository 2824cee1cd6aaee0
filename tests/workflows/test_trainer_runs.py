"""Shipped tiny configs run through the real trainer: registry, rollouts, buffers, updates, checkpoints."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from marljax.train.config import load_config
from marljax.train.metrics import read_metrics

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.slow
def test_heterogeneous_mars2_tiny_config_trains_and_resumes(tmp_path):
    from marljax.train.loop import Trainer

    overrides = [
        f"run_dir={tmp_path / 'run'}",
        "train.steps=2",
        "train.save_every=1",
        "train.eval_every=2",
        "train.log_to=[]",
        "train.progress=false",
        "sampler.max_new_tokens=16",
        "data.batch_size=2",
        "data.source.n_eval=2",
        "workflow.max_nodes=4",
        "workflow.prior=reward_average",
        "policies.coder_qwen.buffer.threshold=4",
        "policies.coder_llama.buffer.threshold=4",
    ]
    cfg = load_config(CONFIGS / "mars2_tiny.yaml", overrides)
    trainer = Trainer(cfg)
    trainer.run()
    records = read_metrics(tmp_path / "run")
    assert [r["step"] for r in records] == [0, 1, 2]  # 0: the evaluation before RL
    last = records[-1]
    assert "eval/alice/pass_at_1" in last or any(k.startswith("eval/") for k in last)
    assert {k for k in records[0] if k not in ("step", "time")} == {k for k in last if k.startswith("eval/")}
    for key in (
        "agent/alice/reward",
        "agent/bob/reward",
        "policy/coder_qwen/version",
        "policy/coder_llama/version",
        "agent/alice/distinct_programs",
        "agent/bob/surface_variety",
    ):
        assert np.isfinite(last[key]), key
    # both policies received nodes and updated from their own buffers
    versions = {n: p.version for n, p in trainer.policies.items()}
    assert all(v >= 1 for v in versions.values()), versions
    # the workflow's reward-average priors are part of the checkpointed loop state
    state = trainer.workflow.state_dict()
    again = Trainer(cfg)
    assert again.restore() and again.step == 2
    assert again.workflow.state_dict() == state
    assert {n: p.version for n, p in again.policies.items()} == versions
    again.close()


@pytest.mark.slow
def test_eval_search_cli_reports_mars2_t_plus_numbers(tmp_path, capsys, monkeypatch):
    import json

    from marljax import cli
    from marljax.workflows import mars2

    # the search samples at the training temperature, the single-shot pass@1 greedily (the default
    # eval_sampling): record each agent's temperature in the generator the search is given
    seen, search_eval = [], mars2.search_eval

    def recording(problems, team, generator, *args, **kwargs):
        seen.append({a.name: generator.settings(a.name).temperature for a in team})
        return search_eval(problems, team, generator, *args, **kwargs)

    monkeypatch.setattr(mars2, "search_eval", recording)

    code = cli.main(
        [
            "eval",
            str(CONFIGS / "mars2_tiny.yaml"),
            "--search",
            f"run_dir={tmp_path / 'run'}",
            "data.source.n_eval=2",
            "sampler.max_new_tokens=8",
            "workflow.max_nodes=3",
            "sampler.temperature=0.7",
        ]
    )
    assert code == 0
    assert seen == [{"alice": 0.7, "bob": 0.7}]
    report = json.loads(capsys.readouterr().out)
    assert report["step"] == 0 and report["eval/search/nodes"] == 3.0
    assert 0.0 <= report["eval/search/pass_at_1"] <= report["eval/search/oracle"] <= 1.0
