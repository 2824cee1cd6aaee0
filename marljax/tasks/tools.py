"""Generated tasks that need tools: the ``tools`` source.

* `make_multihop`: a made-up world of people, cities, countries and companies written as passages
  (the corpus the `search` tool indexes) and 2- or 3-hop questions over it; rewarded by exact
  match or token F1 (`marljax.envs.tasks.qa_score`). The names are invented, so only search can
  answer.
* `make_arithmetic`: word problems on 3-4 digit numbers (schema ``math``): the `python` or
  `calculator` tool makes them easy, mental arithmetic hard.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Literal

from pydantic import Field, field_validator

from marljax.envs.search import Passage
from marljax.rewards import Problem

from .sources import GeneratedSource, register_source

__all__ = ["MAX_PEOPLE", "ToolTasks", "make_arithmetic", "make_multihop"]

_SYLLABLES = [
    "ka",
    "lo",
    "mi",
    "ra",
    "ten",
    "vo",
    "zu",
    "bel",
    "dor",
    "fin",
    "gal",
    "hu",
    "nor",
    "pes",
    "sil",
]


# ------------------------------------------------------------------ multi-hop questions
def _names(rng: random.Random, n: int, syllables: int, taken: set[str]) -> list[str]:
    out = []
    while len(out) < n:
        name = "".join(rng.choice(_SYLLABLES) for _ in range(syllables)).capitalize()
        if name not in taken:
            taken.add(name)
            out.append(name)
    return out


MAX_PEOPLE = 64


def make_multihop(
    n: int, seed: int = 0, hops: Sequence[int] = (2, 3), n_people: int = 12, distractors: int = 4
) -> tuple[list[Problem], list[Passage]]:
    """`n` questions (hop counts cycling through `hops`) and the corpus that answers them.

    World: `n_people` people, as many companies, two cities for every three people and a country
    for every three people (at least 8 cities and 4 countries); each person was born in a city,
    each city lies in a country, each company was founded by a person; one passage per fact.
    2 hops: "In which country was <person> born?" (person -> city -> country). 3 hops: "In which
    country was the founder of <company> born?". Each problem also carries its own passages
    (``fields["passages"]``: the supporting ones and `distractors` others, shuffled), HotpotQA's
    distractor setting, which the search tool indexes per problem."""
    if not set(hops) <= {2, 3}:
        raise ValueError(f"hops must be 2 or 3, got {list(hops)}")
    # two-syllable names (cities, first names, companies) run out beyond MAX_PEOPLE
    if not 1 <= n_people <= MAX_PEOPLE:
        raise ValueError(f"n_people must be 1..{MAX_PEOPLE}, got {n_people}")
    rng = random.Random(f"multihop/{seed}")
    taken: set[str] = set()
    countries = _names(rng, max(4, n_people // 3), 3, taken)
    cities = _names(rng, max(8, 2 * n_people // 3), 2, taken)
    people = [f"{a} {b}" for a, b in zip(_names(rng, n_people, 2, taken), _names(rng, n_people, 3, taken))]
    companies = [f"{c} Works" for c in _names(rng, n_people, 2, taken)]
    country_of = {c: rng.choice(countries) for c in cities}
    born_in = {p: rng.choice(cities) for p in people}
    founder = dict(zip(companies, rng.sample(people, len(companies))))
    passages = [Passage(f"city/{c}", c, f"{c} is a city in {country_of[c]}.") for c in cities]
    passages += [Passage(f"person/{p}", p, f"{p} was born in {born_in[p]}.") for p in people]
    passages += [Passage(f"company/{c}", c, f"{c} was founded by {founder[c]}.") for c in companies]
    problems = []
    for i in range(n):
        k = hops[i % len(hops)]
        if k == 2:
            person = rng.choice(people)
            question = f"In which country was {person} born?"
            support = [f"person/{person}", f"city/{born_in[person]}"]
        else:
            company = rng.choice(companies)
            person = founder[company]
            question = f"In which country was the founder of {company} born?"
            support = [f"company/{company}", f"person/{person}", f"city/{born_in[person]}"]
        answer = country_of[born_in[person]]
        others = [p for p in passages if p.id not in support]
        chosen = [p for p in passages if p.id in support] + rng.sample(others, min(distractors, len(others)))
        rng.shuffle(chosen)
        fields = {
            "question": question,
            "answers": [answer],
            "hops": k,
            "supporting": support,
            "passages": [[p.title, p.text] for p in chosen],
        }
        problems.append(
            Problem(f"multihop/{seed}/{i}", question, "qa", f"<multihop seed {seed}>:{i}", fields)
        )
    return problems, passages


# ------------------------------------------------------------------ arithmetic word problems
def make_arithmetic(n: int, seed: int = 0) -> list[Problem]:
    """`n` two-step word problems on 3-4 digit numbers (schema ``math``, integer answers)."""
    rng = random.Random(f"arithmetic/{seed}")
    problems = []
    for i in range(n):
        boxes, per_box, shipped = rng.randint(120, 999), rng.randint(12, 99), rng.randint(100, 999)
        if i % 2 == 0:
            text = (
                f"A warehouse holds {boxes} boxes with {per_box} items each. {shipped} items are shipped. "
                "How many items are left?"
            )
            answer = boxes * per_box - shipped
        else:
            text = (
                f"A farm packs {boxes * per_box + shipped} eggs into cartons of {per_box} eggs. "
                "How many full cartons are there?"
            )
            answer = (boxes * per_box + shipped) // per_box
        problems.append(
            Problem(
                f"arithmetic/{seed}/{i}", text, "math", f"<arithmetic seed {seed}>:{i}", {"answer": answer}
            )
        )
    return problems


@register_source("tools")
class ToolTasks(GeneratedSource):
    """Multi-hop questions over made-up passages (each problem carries its passages) or
    arithmetic word problems."""

    kind: Literal["tools"] = "tools"
    task: Literal["multihop", "arithmetic"] = "multihop"
    hops: list[int] = Field(default_factory=lambda: [2, 3], min_length=1, description="multihop: 2 and/or 3")
    people: int = Field(
        12,
        ge=1,
        le=MAX_PEOPLE,
        description="multihop: people in the made-up world (cities and countries grow with them); with "
        "as many people as questions, a model cannot answer from a memorised world",
    )

    eval_world: Literal["other", "same"] = Field(
        "other",
        description="multihop: the eval split asks about another made-up world (what is measured is "
        "reading the passages, not the names learnt), or about the training one (`same`: the "
        "generator's draws after the training split: its people asked about again, with other distractor "
        "passages in other orders)",
    )

    @field_validator("hops")
    @classmethod
    def _hops(cls, v):
        if not set(v) <= {2, 3}:
            raise ValueError(f"hops must be 2 or 3, got {v}")
        return v

    def make(self, n: int, seed: int, split: str) -> list[Problem]:
        if self.task == "arithmetic":
            return make_arithmetic(n, seed=seed)
        if split == "eval" and self.eval_world == "same":
            drawn = make_multihop(self.n_train + n, seed=self.seed, hops=self.hops, n_people=self.people)[0]
            return drawn[self.n_train :]
        return make_multihop(n, seed=seed, hops=self.hops, n_people=self.people)[0]
