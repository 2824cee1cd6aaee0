"""SFT's own optimiser settings (`train.sft_*`) and its scripted-teacher examples (`train.sft_teacher`):
a teacher plays the workflow, its turns become each policy's SFT batches (marljax.train.sft)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from marljax.train.config import ConfigError, OptimizerConfig, TrainConfig, load_config
from marljax.train.optim import make_schedule
from marljax.train.sft import demonstrations, pair_batches, sft_optimizer
from marljax.workflows.base import Agent

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_sft_optimizer_is_the_policys_with_what_train_sets_changed():
    policy = OptimizerConfig(lr=5e-4, weight_decay=0.01)
    assert sft_optimizer(policy, TrainConfig(), 300) is None  # nothing set: the policy's own
    assert sft_optimizer(policy, TrainConfig(sft_lr=1e-2), 300) == policy.model_copy(update={"lr": 1e-2})
    train = TrainConfig(sft_lr=1e-2, sft_warmup_steps=10, sft_schedule="cosine", sft_min_lr_ratio=0.1)
    sft = sft_optimizer(policy, train, 300)
    assert (sft.name, sft.weight_decay, sft.max_grad_norm) == ("adamw", 0.01, policy.max_grad_norm)
    schedule = make_schedule(sft)
    # by hand: linear from 0 to the peak over 10 steps, then cosine from 1e-2 to 1e-3 over the 300
    # SFT steps (halfway: the mean of the two)
    assert float(schedule(0)) == 0.0
    assert float(schedule(5)) == pytest.approx(5e-3)
    assert float(schedule(10)) == pytest.approx(1e-2)
    assert float(schedule(160)) == pytest.approx(5.5e-3, rel=1e-5)
    assert float(schedule(310)) == pytest.approx(1e-3, rel=1e-5)


def test_pair_batches_cycle_through_every_example_in_batches_of_similar_length():
    agent = Agent("a", "p")
    pairs = [(agent, ("x" * n, "y")) for n in range(1, 101)]  # prompts of 1..100 characters
    batches = pair_batches(pairs, 40, 4, "seed")
    assert len(batches) == 40 and all(len(b) == 4 for b in batches)
    seen = Counter(p[1][0] for b in batches for p in b)
    assert len(seen) == 100 and set(seen.values()) <= {1, 2}  # 160 draws: each example once or twice
    # consecutive examples of a sorted window of 32 (8 batches): a batch spans ~3 gaps of ~3
    # characters, where 4 examples drawn at random out of 100 span 60 on average (3/5 of the range)
    spans = [max(len(p[1][0]) for p in b) - min(len(p[1][0]) for p in b) for b in batches]
    assert sum(spans) / len(spans) < 20, spans
    assert pair_batches(pairs, 40, 4, "seed") == batches  # deterministic from the seed
    assert pair_batches(pairs, 40, 4, "other") != batches
    with pytest.raises(ValueError, match="fewer than a batch"):
        pair_batches(pairs[:3], 1, 4, "seed")


def test_teacher_demonstrations_hold_every_role_of_the_workflow():
    """The tool team's teacher plays all three Dr. MAS roles on the config's train problems, in the
    formats the workflow parses: the searcher's turns are tool calls, the answerer's answers."""
    cfg = load_config(CONFIGS / "dr_mas_search_sft_tiny.yaml", ["train.sft_teacher.rounds=2"])
    teacher = cfg.train.sft_teacher
    pairs = demonstrations(cfg, teacher.make_script(cfg.seed), teacher.rounds, cfg.seed)
    assert set(pairs) == {"router", "searcher", "answerer"} and all(pairs.values())
    assert all('"name": "search"' in reply for _, reply in pairs["searcher"])
    assert all(reply.startswith("<answer>") for _, reply in pairs["answerer"])
    # each round plays data.batch_size problems: every answerer prompt holds one of their questions
    questions = {p.prompt for p in cfg.data.source.split("train")[: 2 * cfg.data.batch_size]}
    assert {next(q for q in questions if q in prompt) for prompt, _ in pairs["answerer"]} == questions


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ("marljax.demo.tools", "expected `module:function`"),
        ("marljax.no_such_module:teacher", "module 'marljax.no_such_module' cannot be imported"),
        ("marljax.demo.tools:no_such_teacher", "has no function 'no_such_teacher'"),
    ],
)
def test_a_teacher_that_cannot_be_found_is_a_config_error_naming_the_key(script, message):
    with pytest.raises(ConfigError, match=r"train\.sft_teacher\.script") as e:
        load_config(CONFIGS / "dr_mas_search_sft_tiny.yaml", [f"train.sft_teacher.script={script}"])
    assert message in str(e.value)


def test_teacher_options_the_function_does_not_take_are_a_config_error():
    with pytest.raises(
        ConfigError, match=r"train\.sft_teacher\.options: marljax\.demo\.tools:teacher does not take"
    ):
        load_config(CONFIGS / "dr_mas_search_sft_tiny.yaml", ["train.sft_teacher.options.slipz=0.5"])


def test_a_code_teams_teacher_meets_the_sandboxs_feedback_in_its_refinement_prompts():
    """MARS2 refines earlier programs with their test feedback: recording a teacher's turns runs the
    workflow with the trainer's verifier, so the refinement prompts SFT trains on hold real feedback
    on the teacher's own (here always wrong) program."""
    from marljax.rewards import SandboxPool, SandboxVerifier

    cfg = load_config(CONFIGS / "mars2_tiny.yaml")
    wrong = "```python\ndef f(x):\n    return None\n```"
    with SandboxPool(max_workers=2) as pool:
        pairs = demonstrations(cfg, lambda agent, prompt, k, s: wrong, 1, 0, verifier=SandboxVerifier(pool))
    prompts = [prompt for ps in pairs.values() for prompt, _ in ps]
    refinements = [p for p in prompts if "Previous attempt:" in p]
    assert refinements and len(refinements) < len(prompts)  # first attempts and refinements
    assert all("return None" in p and "Feedback on the public tests:" in p for p in refinements)


def test_the_model_for_a_code_teams_teacher_config_is_written(tmp_path, monkeypatch):
    """`python -m marljax.demo.tools CONFIG` on a code team: recording the teacher's turns runs
    its programs in the sandbox (MAGRPO's second turn carries their feedback); the teacher is a
    user's module on the path."""
    from transformers import AutoTokenizer

    from marljax.demo.tools import write_teacher_model

    (tmp_path / "my_teacher.py").write_text(
        "def wrong(seed):\n"
        "    return lambda agent, prompt, k, s: '```python\\ndef f(x):\\n    return None\\n```'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load_config(
        CONFIGS / "magrpo_tiny.yaml",
        [
            "policies.shared.model.preset=null",
            f"policies.shared.model.path={tmp_path / 'model'}",
            "train.sft_teacher.script=my_teacher:wrong",
            "train.sft_teacher.rounds=1",
        ],
    )
    path = write_teacher_model(cfg)
    assert path == tmp_path / "model" and (path / "config.json").is_file()
    assert len(AutoTokenizer.from_pretrained(path)) > 256  # merges learnt from the recorded texts
