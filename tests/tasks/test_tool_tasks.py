"""Generated tool tasks (multi-hop questions over a made-up corpus, arithmetic word problems) and
the HotpotQA / MuSiQue loader, as functions and as run config sources."""

from __future__ import annotations

import json
import re

import pytest

from marljax.envs.search import BM25Index
from marljax.envs.tasks import numeric_score, qa_score
from marljax.tasks import load_qa_jsonl, make_arithmetic, make_multihop


def facts(passages):
    """The world read back from the passage texts (independently of the generator's dicts)."""
    born, country, founder = {}, {}, {}
    for p in passages:
        if m := re.fullmatch(r"(.+) was born in (.+)\.", p.text):
            born[m[1]] = m[2]
        elif m := re.fullmatch(r"(.+) is a city in (.+)\.", p.text):
            country[m[1]] = m[2]
        elif m := re.fullmatch(r"(.+) was founded by (.+)\.", p.text):
            founder[m[1]] = m[2]
    return born, country, founder


def test_multihop_answers_follow_the_corpus():
    problems, passages = make_multihop(12, seed=3)
    born, country, founder = facts(passages)
    assert [p.fields["hops"] for p in problems] == [2, 3] * 6
    for p in problems:
        if m := re.fullmatch(r"In which country was the founder of (.+) born\?", p.prompt):
            expected = country[born[founder[m[1]]]]
        else:
            expected = country[born[re.fullmatch(r"In which country was (.+) born\?", p.prompt)[1]]]
        assert p.fields["answers"] == [expected] and p.schema == "qa"
        assert len(p.fields["supporting"]) == p.fields["hops"]
        # the problem's own passages: its supporting facts and 4 others of the same world
        own = {(t, x) for t, x in p.fields["passages"]}
        by_id = {q.id: (q.title, q.text) for q in passages}
        assert {by_id[i] for i in p.fields["supporting"]} <= own and len(own) == p.fields["hops"] + 4
        assert own <= set(by_id.values())
    assert make_multihop(12, seed=3) == (problems, passages)  # deterministic
    assert make_multihop(12, seed=4)[1] != passages


def test_a_larger_world_has_more_people_cities_and_countries():
    problems, passages = make_multihop(64, seed=1, hops=[2], n_people=64)
    born, country, _ = facts(passages)
    assert len(born) == 64 and len(country) == 2 * 64 // 3 and len(set(country.values())) <= 64 // 3
    # the answers follow the corpus, and 64 questions over 64 people repeat few of them
    for p in problems:
        person = re.fullmatch(r"In which country was (.+) born\?", p.prompt)[1]
        assert p.fields["answers"] == [country[born[person]]]
    assert len({p.prompt for p in problems}) > 32
    assert make_multihop(4, seed=0)[1] == make_multihop(4, seed=0, n_people=12)[1]  # the default world
    with pytest.raises(ValueError, match="n_people must be 1..64"):
        make_multihop(4, n_people=65)


def test_the_eval_split_asks_about_another_world_or_the_training_one():
    """`eval_world`: by default the eval questions are about another world (other names); `same`
    asks new questions of the training world: its passages, none of the training problems."""
    from marljax.tasks import ToolTasks

    def world(problems):
        return {text for p in problems for _, text in p.fields["passages"]}

    source = ToolTasks(task="multihop", n_train=16, n_eval=24, hops=[2], seed=5)
    train = source.split("train")
    same = source.model_copy(update={"eval_world": "same"}).split("eval")
    _, passages = make_multihop(1, seed=5, hops=[2])
    assert len(same) == 24 and world(train) | world(same) <= {p.text for p in passages}
    assert not {p.id for p in train} & {p.id for p in same}
    assert not world(source.split("eval")) & {p.text for p in passages}  # another world
    # the generator's draws after the training split: the first 16 of 40 draws are the training ones
    assert [p.prompt for p in make_multihop(40, seed=5, hops=[2])[0][16:]] == [p.prompt for p in same]


def test_each_hop_is_found_by_search():
    problems, passages = make_multihop(4, seed=0)
    index = BM25Index(passages)
    by_id = {p.id: p for p in passages}
    p3 = next(p for p in problems if p.fields["hops"] == 3)
    company_id, person_id, city_id = p3.fields["supporting"]
    company = by_id[company_id].title
    assert index.search(company, k=1)[0][0].id == company_id
    assert index.search(by_id[person_id].title, k=1)[0][0].id == person_id
    assert index.search(by_id[city_id].title + " city", k=1)[0][0].id == city_id


def test_arithmetic_answers():
    problems = make_arithmetic(4, seed=1)
    for p in problems:
        nums = [int(x) for x in re.findall(r"\d+", p.prompt)]
        expected = nums[0] * nums[1] - nums[2] if "left" in p.prompt else nums[0] // nums[1]
        assert p.fields["answer"] == expected and p.is_math
        assert numeric_score(p, f"It is {expected:,}.") == 1.0
        assert numeric_score(p, str(expected + 1)) == 0.0 and numeric_score(p, "none") == 0.0


def test_hotpotqa_and_musique_rows(tmp_path):
    path = tmp_path / "qa.jsonl"
    rows = [
        {
            "_id": "h1",
            "question": "Q1?",
            "answer": "A1",
            "context": [["T1", ["S1. ", "S2."]], ["T2", ["S3."]]],
        },
        {
            "id": "m1",
            "question": "Q2?",
            "answer": "A2",
            "answer_aliases": ["a two"],
            "paragraphs": [
                {"title": "T1", "paragraph_text": "S1. S2."},
                {"title": "T3", "paragraph_text": "S4."},
            ],
        },
        {"question": "Q3?", "answers": ["x", "y"]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    problems, passages = load_qa_jsonl(path)
    assert [p.id for p in problems] == ["h1", "m1", "2"]
    assert [p.fields["answers"] for p in problems] == [["A1"], ["A2", "a two"], ["x", "y"]]
    assert [(p.title, p.text) for p in passages] == [("T1", "S1. S2."), ("T2", "S3."), ("T3", "S4.")]
    assert problems[1].fields["passages"] == [["T1", "S1. S2."], ["T3", "S4."]]
    assert problems[2].fields["passages"] == []
    assert qa_score(problems[1], "A two") == 1.0


@pytest.mark.parametrize(
    "row, message",
    [
        ({"answer": "a"}, "needs a 'question' string"),
        ({"question": "q"}, "needs an 'answer' string"),
        ({"question": "q", "answers": []}, "non-empty list"),
        ({"question": "q", "answer": "a", "context": [["t"]]}, "'context' must be"),
        ({"question": "q", "answer": "a", "paragraphs": [{"title": "t"}]}, "'paragraph_text'"),
    ],
)
def test_bad_rows_name_file_and_line(tmp_path, row, message):
    path = tmp_path / "qa.jsonl"
    path.write_text('{"question": "ok", "answer": "a"}\n' + json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=rf"qa.jsonl:2: .*{re.escape(message)}"):
        load_qa_jsonl(path)


def test_run_configs_load_qa_rows_and_generated_tool_tasks(tmp_path):
    from marljax.train.config import DataConfig

    path = tmp_path / "qa.jsonl"
    path.write_text(
        json.dumps({"_id": "h1", "question": "Q?", "answer": "A", "context": [["T", ["S."]]]}) + "\n"
    )
    (p,) = DataConfig(source={"kind": "qa", "train": str(path)}).source.split("train")
    assert p.id == "h1" and p.fields["passages"] == [["T", "S."]] and p.schema == "qa"
    generated = DataConfig(
        source={"kind": "tools", "task": "multihop", "n_train": 3, "n_eval": 2, "hops": [3]}
    )
    train, held_out = generated.source.split("train"), generated.source.split("eval")
    assert [q.fields["hops"] for q in train] == [3, 3, 3] and len(held_out) == 2
    assert {q.prompt for q in train}.isdisjoint({q.prompt for q in held_out})
    arithmetic = DataConfig(source={"kind": "tools", "task": "arithmetic", "n_train": 2}).source.split(
        "train"
    )
    assert [q.schema for q in arithmetic] == ["math", "math"]
    with pytest.raises(ValueError, match="hops must be 2 or 3"):
        DataConfig(source={"kind": "tools", "hops": [4]})
