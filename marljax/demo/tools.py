"""A warm start for the tool workflows: sloppy teachers, their demonstrations, SFT, then RL.

Random tiny models never call a tool nor answer, so RL on the tool workflows gets no reward.
As the code demo does (`marljax.demo.teacher`), a teacher plays every agent's turns on the
generated tasks, in the exact formats the workflows parse, but slips on purpose at a stated rate
in ways only the team's reward tells apart (each setup is named as its shipped config,
`configs/<name>_tiny.yaml`: `dr_mas`, `sharp` and `at_grpo` with `tools:`):

* ``dr_mas_search``: the router says ``answer`` after the first search (the notes hold the city,
  not the country); the answer agent copies the city instead of the country.
* ``sharp_tools``: worker 1 answers without searching; worker 2 answers its city, not its
  country.
* ``at_grpo_tools``: the tool agent checks only the first move; the plan agent commits only the
  first move of a checked plan.

The teacher is a `ScriptedGenerator` script, so its demonstrations are recorded by running the
workflow itself (`marljax.train.sft.demonstrations`): every prompt is exactly one the workflow
builds; a run config names it as `train.sft_teacher: {script: "marljax.demo.tools:teacher",
options: {kind: ..., slips: ...}}`. The tiny
models share one BPE tokenizer learnt from those texts (short prompts, as in the code demo).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from marljax.envs.grid import shortest_plan
from marljax.envs.tool_calls import format_tool_call
from marljax.workflows.base import Agent

_BORN = re.compile(r"([A-Z][a-z]+ [A-Z][a-z]+) was born in ([A-Z][a-z]+)")
_CITY = re.compile(r"([A-Z][a-z]+) is a city in ([A-Z][a-z]+)")
_PERSON = re.compile(r"In which country was ([A-Z][a-z]+ [A-Z][a-z]+) born\?")
_CHECKED = re.compile(r"\[check_plan\] \{'moves': '([UDLR]*)'\} -> reaches the goal")


def _answer(text: str) -> str:
    return f"<answer>{text}</answer>"


def _facts(prompt: str) -> tuple[str, dict[str, str], dict[str, str]]:
    """The question's person, and the birth cities and countries the prompt's notes state."""
    person = _PERSON.search(prompt)[1]
    return person, dict(_BORN.findall(prompt)), dict(_CITY.findall(prompt))


def teacher(kind: str, slips: float, seed: int = 0):
    """The sloppy teacher of tool setup `kind` (module doc): a `ScriptedGenerator` script that slips at rate `slips`
    (module doc); each call draws its own slip, so a prompt's demonstrations hold both habits."""
    rng = random.Random(f"marljax-tool-teacher:{kind}:{seed}")

    def slip() -> bool:
        return rng.random() < slips

    def dr_mas(agent: Agent, prompt: str, k: int, s: int) -> str:
        person, born, country = _facts(prompt)
        city = born.get(person)
        if agent.name == "router":
            if city is None:
                return "search"
            return "answer" if city in country or slip() else "search"
        if agent.name == "searcher":
            return format_tool_call("search", {"query": city if city else person})
        if city in country and not slip():
            return _answer(country[city])
        return _answer(city or "unknown")

    def sharp(agent: Agent, prompt: str, k: int, s: int) -> str:
        person, born, country = _facts(prompt)
        if agent.name == "planner":
            return "1. Find the city.\n2. Find its country."
        if "You are worker 1" in prompt:
            if person in born:
                return _answer(born[person])
            return _answer(person) if slip() else format_tool_call("search", {"query": person})
        told = re.search(r"^Worker 1: (.+)$", prompt, re.MULTILINE)
        city = born.get(person) or (told[1] if told else person)
        if city in country:
            return _answer(city if slip() else country[city])
        return format_tool_call("search", {"query": city})  # the person, then the city they were born in

    def grid(agent: Agent, prompt: str, k: int, s: int) -> str:
        if agent.name == "tool_agent":
            plan = shortest_plan_in(prompt)
            return format_tool_call("check_plan", {"moves": plan[:1] if slip() else plan})
        checked = _CHECKED.findall(prompt)
        if checked:
            return f"Moves: {checked[-1][:1] if slip() else checked[-1]}"
        return f"Moves: {shortest_plan_in(prompt)[:1]}"

    scripts = {"dr_mas_search": dr_mas, "sharp_tools": sharp, "at_grpo_tools": grid}
    if kind not in scripts:
        raise ValueError(f"no tool teacher for workflow {kind!r}; known: {', '.join(scripts)}")
    return scripts[kind]


def shortest_plan_in(prompt: str) -> str:
    """The shortest plan from A to G of the last grid drawn in `prompt` (the teacher reads the
    grid as the agents see it: '#' walls, 'A' the agent, 'G' the goal)."""
    rows = re.findall(r"^[#.AG]+$", prompt, re.MULTILINE)
    size = len(rows[-1])
    rows = rows[-size:]
    cells = {(r, c): ch for r, line in enumerate(rows) for c, ch in enumerate(line)}
    at = next(x for x, ch in cells.items() if ch == "A")
    goal = next(x for x, ch in cells.items() if ch == "G")
    fields = {"size": size, "walls": [list(x) for x, ch in cells.items() if ch == "#"], "goal": list(goal)}
    return shortest_plan(fields, at) or ""


# a small Qwen3 (the code demo's family, plain rope): the tool prompts are longer than the code ones
MODEL = dict(
    hidden_size=96,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=24,
    rope_theta=10000.0,
)


def write_model(path: Path, texts: Sequence[str], seed: int = 0, vocab: int = 512) -> Path:
    """A random tiny Qwen3 checkpoint at `path` with a BPE tokenizer learnt from `texts`."""
    from marljax.models.tokenizer import make_tokenizer
    from marljax.testing import write_random_checkpoint

    tokenizer = make_tokenizer(vocab_size=vocab, corpus=list(texts))
    write_random_checkpoint(
        path,
        "qwen3",
        seed=seed,
        std=0.02,
        tokenizer=False,
        vocab_size=vocab,
        max_position_embeddings=1024,
        **MODEL,
    )
    tokenizer.save_pretrained(str(path))
    (path / "texts.json").write_text(json.dumps(len(texts)))
    return path


CONFIGS = Path(__file__).resolve().parents[2] / "configs"
# the warm-start recipe's changes to a shipped tiny config: the grid team plays 4x4 grids (the tiny
# model cannot plan 5x5 ones) and the same 8 each step, so the team reward measures the team, not
# which grids a step drew (over 32 grids it swung from 0.03 to 0.54 between steps); SHARP's workers
# get a third turn, so that worker 2 told a person rather than a city can still find the country
RECIPE_CHANGES = {
    "at_grpo_tools": {"data.source.size": 4, "data.source.n_train": 8},
    "sharp_tools": {"workflow.tools.max_turns": 3},
}
# SFT steps where not 300: SHARP's team rises more from a sloppier warm start of half the steps; from
# one, Dr. MAS's team rose less and AT-GRPO's not at all (seed 0; benchmarks/RESULTS.md)
SFT_STEPS = {"sharp_tools": 150}


def warm_started_run(
    kind: str,
    out: Path,
    *,
    seed: int = 0,
    slips: float = 0.5,
    demo_rounds: int = 16,
    sft_steps: int | None = None,
    sft_batch: int = 16,
    sft_lr: float = 1e-2,
    rl_steps: int = 20,
    rl_lr: float = 5e-4,
    problems_per_step: int = 8,
    temperature: float = 0.6,
    max_new_tokens: int = 40,
    kl_coef: float = 0.1,
    changes: dict | None = None,
    evaluate: int = 0,
    evaluate_on: str = "fresh",
) -> list[dict]:
    """SFT a tiny model on tool setup `kind`'s sloppy teacher (shipped tiny config, one shared policy),
    then `rl_steps` of RL; the run's metrics records (one per RL step). `changes` updates the config
    dict (dotted keys) before both stages, after `RECIPE_CHANGES`; `sft_steps` defaults to
    `SFT_STEPS`'s, else 300.

    RL samples at `temperature` 0.6: after a few hundred SFT steps the tiny model's next-token
    distribution over a name it should copy is still broad, and at temperature 1 most sampled
    calls search a misspelt name, so hardly any episode succeeds and RL has nothing to reinforce.
    RL keeps a KL penalty of `kl_coef` to the warm start: without one a team's calls can decay to
    invalid ones and then to none, for good (benchmarks/RESULTS.md).

    `evaluate` > 0: the team also plays that many problems once each at RL's sampling, before RL and
    after it, with the same seeds both times (`evaluation_problems`: fresh ones, or with `evaluate_on`
    "train" its training split over and over); `out/evaluation.json` holds both team rewards
    (`evaluate_team`)."""
    import yaml

    from marljax.train.config import config_from_dict
    from marljax.train.loop import Trainer
    from marljax.train.metrics import read_metrics
    from marljax.train.sft import run_sft

    sft_steps = SFT_STEPS.get(kind, 300) if sft_steps is None else sft_steps
    raw = yaml.safe_load((CONFIGS / f"{kind}_tiny.yaml").read_text())
    raw.update(name=f"{kind}_rise", run_dir=str(out / "run"), seed=seed)
    # a whole tool call in one turn (the shipped tiny configs' 16 tokens cut it); few batch and
    # prompt shapes: multi-turn episodes and counterfactual re-runs sample batches of every size and
    # length, and compiling a sampler program for each cost most of the RL run (the tokens do not
    # depend on the padding)
    raw["sampler"] = dict(
        raw["sampler"],
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        min_batch_bucket=16,
        min_prompt_bucket=256,
    )
    raw["data"] = dict(raw["data"], batch_size=problems_per_step)
    raw["train"] = dict(raw["train"], steps=rl_steps, save_every=rl_steps, eval_every=None)
    raw["train"].update(log_to=[], progress=False, keep_checkpoints=1)
    for key, value in {**RECIPE_CHANGES.get(kind, {}), **(changes or {})}.items():
        *path, last = key.split(".")
        d = raw
        for p in path:
            d = d.setdefault(p, {})
        d[last] = value
    (policy,) = raw["policies"]
    if kl_coef:
        loss = dict(raw["policies"][policy].get("loss", {}), kl_coef=kl_coef)
        raw["policies"][policy] = dict(raw["policies"][policy], reference=True, loss=loss)
    base = dict(raw["policies"][policy], model={"path": str(out / "model")}, chat="off")
    raw["policies"][policy] = dict(base, optimizer={"lr": rl_lr})
    sft = dict(
        sft_steps=sft_steps,
        sft_lr=sft_lr,
        sft_warmup_steps=10,
        sft_schedule="cosine",
        sft_min_lr_ratio=0.1,
        sft_batch_size=sft_batch,
        sft_teacher={
            "script": f"{__name__}:teacher",
            "options": {"kind": kind, "slips": slips},
            "rounds": demo_rounds,
        },
    )
    sft_cfg = config_from_dict({**raw, "train": {**raw["train"], **sft}}, source=f"<{kind} sft>")
    # the model's tokenizer learns the demonstrations' texts; run_sft records them again (the
    # teacher draws the same slips), now tokenised
    write_teacher_model(sft_cfg)
    trainer = Trainer(sft_cfg)
    try:
        losses = LossLog()
        run_sft(trainer, sft_steps, losses)
        (out / "sft_losses.json").write_text(json.dumps(losses.losses))
        trainer.policies[policy].export(out / "model-sft")
    finally:
        trainer.close()
    base["model"] = {"path": str(out / "model-sft")}
    raw["policies"][policy] = dict(base, optimizer={"lr": rl_lr})
    trainer = Trainer(config_from_dict(raw, source=f"<{kind} rl>"))
    try:
        problems = evaluation_problems(trainer.cfg.data.source, evaluate, evaluate_on) if evaluate else []
        before = evaluate_team(trainer, problems) if evaluate else None
        trainer.run()
        if evaluate:
            after = evaluate_team(trainer, problems)
            evaluation = {"before": before, "after": after, "problems": evaluate, "on": evaluate_on}
            (out / "evaluation.json").write_text(json.dumps(evaluation))
    finally:
        trainer.close()
    return read_metrics(out / "run")


class LossLog:
    """A metrics writer for `run_sft` that keeps only the SFT losses, in order."""

    def __init__(self):
        self.losses: list[float] = []

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        self.losses += [v for k, v in metrics.items() if k.endswith("/loss")]


def fresh_problems(tasks: Any, n: int) -> list:
    """`n` problems of the training distribution that the training split does not hold: the
    generator's next draws. Multi-hop questions: the same world (people, cities, countries), other
    questions' mixes, other distractor passages and orders (the source's `eval_world: same`); not
    the default eval split, which is another world, where the warm-started tiny team scores 0 before
    and after RL (it learns its world's names, not to copy any name; benchmarks/RESULTS.md). Grids:
    other layouts of the same size."""
    from marljax.tasks import make_grid_problems

    if tasks.kind == "grid":
        return make_grid_problems(tasks.n_train + n, seed=tasks.seed, size=tasks.size)[tasks.n_train :]
    if tasks.kind == "tools" and tasks.task == "multihop":
        return tasks.model_copy(update={"n_eval": n, "eval_world": "same"}).split("eval")
    raise ValueError(f"fresh_problems: grid or multi-hop tool tasks only, not {tasks.kind}")


def evaluation_problems(tasks: Any, n: int, on: str) -> list:
    """`n` problems to play before and after RL: `fresh_problems` ("fresh"), or the training split
    repeated in order ("train": a team trained on a few fixed problems, such as the grid team's 8, is
    measured on them, each played n / len(split) times)."""
    if on == "fresh":
        return fresh_problems(tasks, n)
    if on != "train":
        raise ValueError(f"evaluate_on: 'fresh' or 'train', not {on!r}")
    train = tasks.split("train")
    return [train[i % len(train)] for i in range(n)]


def evaluate_team(trainer: Any, problems: Sequence, chunk: int = 32) -> float:
    """The team's mean reward over `problems`, one episode each sampled as in RL (the training
    generator; the workflow's evaluation seeds are fixed, so the same problems get the same random
    draws before and after RL). Chunks of 32 problems sample batches of a training step's size and
    reuse its compiled programs. A step's training reward is 8 problems of 32 x 4 episodes and
    swings by ~0.15 between steps with the problems drawn; a fixed set does not.

    Every call samples with the same seeds, row by row: a problem (by id) met again in a later chunk
    would replay its earlier episode, so a list that repeats problems is played in one call."""
    if len({p.id for p in problems}) < len(problems):
        chunk = len(problems)
    trainer.sync_samplers()
    total = 0.0
    for c in range(0, len(problems), chunk):
        part = problems[c : c + chunk]
        scores = trainer.workflow.evaluate(part, trainer.agents, trainer.generator, trainer.verifier)
        total += scores["eval/team/reward"] * len(part)
    return total / len(problems)


def write_teacher_model(cfg: Any) -> Path:
    """Write the random tiny model that run config `cfg` loads (its one policy's `model.path`), with
    a tokenizer learnt from the texts of its `train.sft_teacher`'s demonstrations (the rounds SFT
    will record): what `python -m marljax.demo.tools CONFIG [key=value ...]` does."""
    from marljax.rewards import SandboxVerifier
    from marljax.train.loop import sandbox_pool
    from marljax.train.sft import demonstrations

    teacher_cfg, (policy,) = cfg.train.sft_teacher, cfg.policies.values()
    if teacher_cfg is None or policy.model.path is None:
        raise ValueError("write_teacher_model: needs train.sft_teacher and one policy with a model.path")
    script = teacher_cfg.make_script(cfg.seed)
    with sandbox_pool(cfg.sandbox) as pool:  # code teams' prompts carry the tests' feedback
        pairs = demonstrations(cfg, script, teacher_cfg.rounds, cfg.seed, verifier=SandboxVerifier(pool))
    texts = [t for ps in pairs.values() for p in ps for t in p]
    return write_model(Path(policy.model.path), texts, seed=cfg.seed)


if __name__ == "__main__":
    import argparse

    from marljax.train.config import load_config

    parser = argparse.ArgumentParser(
        prog="python -m marljax.demo.tools",
        description="Write the random tiny model a run config with train.sft_teacher loads (its "
        "model.path), with a tokenizer learnt from the teacher's demonstrations.",
    )
    parser.add_argument("config", help="e.g. configs/dr_mas_search_sft_tiny.yaml")
    parser.add_argument("overrides", nargs="*", help="dotted key=value, as `marljax train` takes them")
    args = parser.parse_args()
    print(write_teacher_model(load_config(args.config, args.overrides)))
