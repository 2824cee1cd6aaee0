"""The tool workflows' warm start (marljax.demo.tools): the sloppy teachers and their demonstrations.
The rise under RL after it: the `test_tool_rise_*` files (`tool_rise.py`)."""

from __future__ import annotations

import pytest

from marljax.demo.tools import teacher
from marljax.workflows.base import Agent


def test_teachers_slip_at_their_rate():
    """The teacher's answer agent copies the city instead of the country about half the time."""
    script = teacher("dr_mas_search", 0.5, seed=3)
    prompt = (
        "In which country was Kalo Mira born?\n\nNotes:\n[search] [1] Kalo Mira: Kalo Mira was born in Vo.\n"
        "[search] [1] Vo: Vo is a city in Belten."
    )
    answers = [script(Agent("answerer", "p"), prompt, 0, 0) for _ in range(400)]
    assert set(answers) == {"<answer>Belten</answer>", "<answer>Vo</answer>"}
    assert 0.4 < answers.count("<answer>Vo</answer>") / 400 < 0.6
    assert teacher("dr_mas_search", 0.0)(Agent("answerer", "p"), prompt, 0, 0) == "<answer>Belten</answer>"


def test_sharp_teachers_worker_2_finds_the_country_from_whatever_it_was_told():
    """Told the city, worker 2 searches it and answers its country; told the person (worker 1's slip),
    it searches the person, then the city it finds, then answers; it answers only after a city fact."""
    script = teacher("sharp_tools", 0.0)
    head = (
        "In which country was Kalo Mira born?\n\nAnswers of the workers before you:\nWorker 1: {}\n\n"
        "You are worker 2 of 2."
    )
    w2 = Agent("worker2", "p")

    def call(query):
        return f'<tool_call>\n{{"name": "search", "arguments": {{"query": "{query}"}}}}\n</tool_call>'

    born = "\n\nObservation:\n[search] [1] Kalo Mira: Kalo Mira was born in Vo."
    city = "\n\nObservation:\n[search] [1] Vo: Vo is a city in Belten."
    assert script(w2, head.format("Vo"), 0, 0) == call("Vo")
    assert script(w2, head.format("Vo") + city, 0, 0) == "<answer>Belten</answer>"
    assert script(w2, head.format("Kalo Mira"), 0, 0) == call("Kalo Mira")
    assert script(w2, head.format("Kalo Mira") + born, 0, 0) == call("Vo")
    assert script(w2, head.format("Kalo Mira") + born + city, 0, 0) == "<answer>Belten</answer>"


def test_demonstrations_encode_later_turns_as_the_policy_will_sample_them(tmp_path):
    """A worker's second turn continues its first: SFT must see the first turn's tokens ending with
    the end-of-turn token, as the policy's own sampled turn will end (not the script's bytes)."""
    import yaml

    from marljax.demo.tools import CONFIGS, write_model
    from marljax.train.config import config_from_dict
    from marljax.train.loop import Trainer
    from marljax.train.sft import demonstrations

    raw = yaml.safe_load((CONFIGS / "sharp_tools_tiny.yaml").read_text())
    raw.update(run_dir=str(tmp_path / "run"))
    texts = [
        t
        for ps in demonstrations(config_from_dict(raw), teacher("sharp_tools", 0.3), 2).values()
        for p in ps
        for t in p
    ]
    model = write_model(tmp_path / "model", texts)
    raw["policies"]["shared"]["model"] = {"path": str(model)}
    raw["policies"]["shared"]["chat"] = "off"
    cfg = config_from_dict(raw)
    trainer = Trainer(cfg)
    try:
        policy = trainer.policies["shared"]
        turns = {n: p.turns for n, p in trainer.policies.items()}
        pairs = demonstrations(cfg, teacher("sharp_tools", 0.3), 2, policies=turns)["worker2"]
        earlier = {str(p) + r: (p, r) for p, r in pairs}
        later = [(p, r) for p, r in pairs if "Observation:" in p]
        assert later
        tok, eos = policy.turns.tokenizer, policy.turns.eos_ids[0]
        for p, _ in later:
            head = next(k for k in earlier if str(p).startswith(k))
            p0, r0 = earlier[head]
            expected = [
                *tok(str(p0), add_special_tokens=False)["input_ids"],
                *tok(r0, add_special_tokens=False)["input_ids"],
                eos,
                *tok(str(p)[len(head) :], add_special_tokens=False)["input_ids"],
            ]
            assert policy.turns.encode_prompt(p) == expected
    finally:
        trainer.close()


def test_fresh_problems_are_the_generators_next_draws_not_the_training_ones():
    """The problems a tool team is evaluated on before and after RL: the same distribution as its
    training split (grid size; multi-hop world), none of the training problems, deterministic."""
    from marljax.demo.tools import fresh_problems
    from marljax.tasks import GridSource, ToolTasks

    grids = GridSource(size=4, n_train=8, seed=2)
    fresh = fresh_problems(grids, 16)
    train = grids.split("train")
    assert len(fresh) == 16 and all(p.fields["size"] == 4 for p in fresh)
    layout = [(str(p.fields["walls"]), p.fields["start"], p.fields["goal"]) for p in fresh + train]
    assert len(set(map(str, layout))) == 24  # no training grid among them, none twice
    assert [p.prompt for p in fresh_problems(grids, 16)] == [p.prompt for p in fresh]
    # a small world has few questions, so a fresh draw may ask a training question again, with its
    # own distractor passages: the draws are new, the world the same
    questions = ToolTasks(task="multihop", n_train=8, seed=1)
    train = questions.split("train")
    fresh = fresh_problems(questions, 8)
    assert len(fresh) == 8 and not {p.id for p in train} & {p.id for p in fresh}
    answers = {a for p in questions.make(200, 1, "train") for a in p.fields["answers"]}
    assert {a for p in fresh for a in p.fields["answers"]} <= answers
    with pytest.raises(ValueError, match="grid or multi-hop"):
        fresh_problems(ToolTasks(task="arithmetic", n_train=8), 4)


def test_evaluation_problems_are_fresh_ones_or_the_training_split_in_turn():
    from marljax.demo.tools import evaluation_problems, fresh_problems
    from marljax.tasks import GridSource

    grids = GridSource(size=4, n_train=8, seed=2)
    train = grids.split("train")
    again = evaluation_problems(grids, 20, "train")
    assert [p.prompt for p in again] == [p.prompt for p in train + train + train[:4]]
    assert [p.prompt for p in evaluation_problems(grids, 4, "fresh")] == [
        p.prompt for p in fresh_problems(grids, 4)
    ]
    with pytest.raises(ValueError, match="'fresh' or 'train'"):
        evaluation_problems(grids, 4, "eval")
