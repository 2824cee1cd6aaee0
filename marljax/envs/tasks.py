"""Tasks that need tools, generated offline, and loaders for real question sets.

* `make_multihop`: a made-up world of people, cities, countries and companies written as passages
  (the corpus the `search` tool indexes) and 2- or 3-hop questions over it; rewarded by exact
  match or token F1 (`qa_score`). The names are invented, so only search can answer.
* `make_arithmetic`: word problems on 3-4 digit numbers (schema ``math``): the `python` or
  `calculator` tool makes them easy, mental arithmetic hard.
* `grid_checker_tool`: for the grid game of `marljax.envs.grid`, a tool that runs a move string
  and says where it ends (no solver: the agent still has to find the path).
* `load_qa_jsonl`: HotpotQA-, MuSiQue- or plain ``{question, answer}`` JSONL rows as problems,
  and the passages their contexts hold as a corpus.
* `problem_passages`: the passages a problem carries, for a search tool over them alone.
"""

from __future__ import annotations

import collections
import json
import os
import random
import re
import string
from collections.abc import Mapping, Sequence
from typing import Any

from marljax.envs.grid import bfs_distances, parse_moves, run_plan
from marljax.envs.search import Passage
from marljax.envs.tools import Tool
from marljax.rewards import Problem

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


# ------------------------------------------------------------------ answer scores
def normalize_answer(text: str) -> str:
    """Lower case, no punctuation, no articles, single spaces (the SQuAD / HotpotQA normalisation)."""
    text = "".join(ch for ch in text.lower() if ch not in string.punctuation)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def token_f1(prediction: str, reference: str) -> float:
    """F1 of the normalised tokens of `prediction` against `reference`."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(reference).split()
    common = sum((collections.Counter(pred) & collections.Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def qa_answers(problem: Problem) -> list[str]:
    return [str(a) for a in problem.fields["answers"]]


def qa_score(problem: Problem, answer: str, metric: str = "em") -> float:
    """Best exact match (1 or 0) or token F1 of `answer` over the problem's accepted answers."""
    refs = qa_answers(problem)
    if metric == "em":
        return float(any(normalize_answer(answer) == normalize_answer(r) for r in refs))
    if metric == "f1":
        return max(token_f1(answer, r) for r in refs)
    raise ValueError(f"unknown QA metric {metric!r}; known: em, f1")


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


def numeric_score(problem: Problem, answer: str) -> float:
    """1 when the last number in `answer` equals the problem's answer (commas allowed), else 0."""
    numbers = re.findall(r"-?\d[\d,]*(?:\.\d+)?", answer)
    if not numbers:
        return 0.0
    try:
        return float(float(numbers[-1].replace(",", "")) == float(problem.fields["answer"]))
    except ValueError:
        return 0.0


# ------------------------------------------------------------------ the grid with a checker
def grid_checker_tool(problem: Problem, pos: Sequence[int] | None = None, timeout_s: float = 2.0) -> Tool:
    """`check_plan(moves)` on one grid from `pos` (default: its start): where the moves end, whether
    a move hit a wall or the edge, and how far the end is from the goal. It checks, it does not plan."""
    fields = problem.fields
    start = fields["start"] if pos is None else pos

    def check_plan(moves: str) -> str:
        plan = parse_moves(f"Moves: {moves}")
        res = run_plan(fields, start, plan)
        if res.reached:
            return f"reaches the goal after {res.used} moves"
        stop = f"move {res.used + 1} ({plan[res.used]}) hits a wall or the edge; " if res.illegal else ""
        d = bfs_distances(fields)[res.pos]
        return f"{stop}ends at row {res.pos[0]}, column {res.pos[1]}, {d} moves from the goal"

    return Tool(
        "check_plan",
        "Run a move string (U/D/L/R) from the start and see where it ends.",
        {"moves": "string"},
        check_plan,
        timeout_s,
    )


def problem_passages(problem: Problem) -> list[Passage]:
    """The passages a QA problem carries (``fields["passages"]``: ``[[title, text], ...]``)."""
    rows = problem.fields.get("passages")
    if not rows:
        raise ValueError(f"{problem.source}: problem {problem.id!r} carries no passages to search")
    return [Passage(f"{problem.id}/{k}", str(t), str(x)) for k, (t, x) in enumerate(rows)]


# ------------------------------------------------------------------ loaders
def load_qa_jsonl(path: str | os.PathLike) -> tuple[list[Problem], list[Passage]]:
    """Questions (schema ``qa``) and the passages of their contexts from a JSONL file of rows in
    one of these forms (keys checked per row; a bad row is a ValueError naming file and line):

    * HotpotQA: ``{"_id", "question", "answer", "context": [[title, [sentence, ...]], ...]}``;
    * MuSiQue: ``{"id", "question", "answer", "answer_aliases", "paragraphs": [{"title",
      "paragraph_text"}, ...]}``;
    * plain: ``{"id"?, "question", "answer" or "answers": [...]}`` (bring a corpus with
      `marljax.envs.search.load_corpus`).
    Each problem keeps its own passages (``fields["passages"]``, the distractor setting); the
    corpus returned holds them all, deduplicated by (title, text)."""
    problems, passages, seen = [], [], set()
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{os.fspath(path)}:{n}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not JSON ({e.msg})") from None
            if not isinstance(row, dict) or not isinstance(row.get("question"), str):
                raise ValueError(f"{where}: a row needs a 'question' string")
            answers = _row_answers(row, where)
            own = _row_passages(row, where)
            for title, text in own:
                if (title, text) not in seen:
                    seen.add((title, text))
                    passages.append(Passage(f"{len(passages)}", title, text))
            qid = str(row.get("_id", row.get("id", n - 1)))
            fields = {"question": row["question"], "answers": answers, "passages": [list(p) for p in own]}
            problems.append(Problem(qid, row["question"], "qa", where, fields))
    return problems, passages


def _row_answers(row: Mapping[str, Any], where: str) -> list[str]:
    if "answers" in row:
        answers = row["answers"]
        if not (isinstance(answers, list) and answers and all(isinstance(a, str) for a in answers)):
            raise ValueError(f"{where}: 'answers' must be a non-empty list of strings")
        return list(answers)
    if not isinstance(row.get("answer"), str):
        raise ValueError(f"{where}: a row needs an 'answer' string or an 'answers' list")
    aliases = row.get("answer_aliases", [])
    if not (isinstance(aliases, list) and all(isinstance(a, str) for a in aliases)):
        raise ValueError(f"{where}: 'answer_aliases' must be a list of strings")
    return [row["answer"], *aliases]


def _row_passages(row: Mapping[str, Any], where: str) -> list[tuple[str, str]]:
    out = []
    if "context" in row:  # HotpotQA
        try:
            for title, sentences in row["context"]:
                out.append((str(title), "".join(sentences).strip()))
        except (TypeError, ValueError):
            raise ValueError(f"{where}: 'context' must be a list of [title, [sentence, ...]]") from None
    for p in row.get("paragraphs", []):  # MuSiQue
        if not isinstance(p, dict) or not isinstance(p.get("paragraph_text"), str):
            raise ValueError(f"{where}: each of 'paragraphs' needs a 'paragraph_text' string")
        out.append((str(p.get("title", "")), p["paragraph_text"].strip()))
    return out
