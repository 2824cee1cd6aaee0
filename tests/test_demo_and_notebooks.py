"""The README's main command and the executed notebooks."""

import pathlib

import pytest
from script_loader import load_script

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_demo_team_learns(capsys):
    from marljax.demo import kernels as demo

    assert demo.main(["--steps", "80", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    first, last = (
        float(x) for x in out.rsplit("first 10 steps ", 1)[1].split(" (")[0].split(" -> last 10 steps ")
    )
    assert first < 0.4 and last > 0.8, out


@pytest.mark.slow(seconds=65)
def test_embedded_demo_quick_run(tmp_path, capsys):
    """The README's main command end to end in its smoke size (the full size is too long for CI;
    its measured table is in the README): real HF checkpoints, SFT, three RL runs, each team's
    search solve rate and each policy's pass@1 before and after RL, table, PNGs.

    `.ci/run` runs that command first and names its output in MARLJAX_DEMO_QUICK_OUT; the test then
    reruns the command there, which must resume from what the first run left (models, SFT exports,
    RL checkpoints) and print the same table, rather than train everything a second time."""
    import json
    import os
    from pathlib import Path

    import numpy as np
    import transformers
    from safetensors.numpy import load_file

    from marljax.demo.__main__ import QUICK, main
    from marljax.train.metrics import read_metrics

    finished = os.environ.get("MARLJAX_DEMO_QUICK_OUT")
    if finished:
        tmp_path = Path(finished)
        before = json.loads((tmp_path / "results.json").read_text())["results"]
    assert main(["--quick", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    if finished:  # resumed: nothing retrained, so the same numbers
        assert json.loads((tmp_path / "results.json").read_text())["results"] == before
    report = json.loads((tmp_path / "results.json").read_text())
    results, nodes = report["results"], report["settings"]["search_nodes"]
    assert [r["method"] for r in results] == ["grpo", "mars2_homogeneous", "mars2_heterogeneous"]
    assert len({r["samples"] for r in results}) == 1  # equal sample budgets
    for r in results:  # the evaluations a rerun reads back instead of repeating them
        saved = json.loads((tmp_path / r["method"] / "evaluation.json").read_text())
        assert saved["after"]["step"] == QUICK["rl_steps"]
        assert {phase: saved[phase]["search"] for phase in ("before", "after")} == r["search"]
    assert "Headline" in out.split("| method |")[0]  # the search result comes first
    for r in results:
        for phase in ("before", "after"):
            search, policies = r["search"][phase], r["policies"][phase]
            solved, oracle = search["eval/search/pass_at_1"], search["eval/search/oracle"]
            # the chosen answer is one of the tree's nodes: some node passes whenever it does
            assert 0.0 <= solved <= oracle <= 1.0
            # at most the node budget per task (a tree stops at its first public-test pass), all of
            # them written by the team's agents, and one chosen answer per task
            assert 1.0 <= search["eval/search/nodes"] <= nodes
            agents = list(r["agents"])
            assert sum(search[f"eval/search/{a}/nodes"] for a in agents) == pytest.approx(
                search["eval/search/nodes"]
            )
            assert sum(search[f"eval/search/{a}/chosen"] for a in agents) == pytest.approx(1.0)
            assert set(policies) == set(r["agents"].values())
            assert all(0.0 <= v <= 1.0 for v in policies.values())
            # the team's pass@1 is the mean over its agents, each scoring as its policy
            mean = np.mean([policies[p] for p in r["agents"].values()])
            assert r["pass_at_1"][phase] == pytest.approx(mean)
        assert f"| {r['label']} |" in out
        assert f"{100 * r['search']['after']['eval/search/pass_at_1']:.1f}%" in out
        assert f"{100 * r['pass_at_1']['after']:.1f}%" in out
    # two families of different sizes, as transformers reads them
    qwen, llama = (
        transformers.AutoConfig.from_pretrained(tmp_path / "models" / n) for n in ("qwen3", "llama")
    )
    assert (qwen.model_type, llama.model_type) == ("qwen3", "llama")
    assert qwen.hidden_size != llama.hidden_size
    # SFT lowered the loss and its export differs from the base checkpoint
    loss = [r["sft/qwen3/loss"] for r in read_metrics(tmp_path / "sft_qwen3")]
    assert np.mean(loss[-5:]) < 0.5 * np.mean(loss[:5])
    base = load_file(str(tmp_path / "models" / "qwen3" / "model.safetensors"))
    tuned = load_file(str(tmp_path / "models" / "qwen3-sft" / "model.safetensors"))
    assert any(not np.allclose(base[k], tuned[k]) for k in base)
    # every RL run trained and checkpointed; the heterogeneous team has one checkpoint per policy
    steps = sorted((tmp_path / "mars2_heterogeneous" / "checkpoints").iterdir(), key=lambda p: int(p.name))
    managers = {p.name for p in steps[-1].iterdir() if p.is_dir()}  # the items of the newest step
    assert {"llama", "qwen3", "loop"} <= managers
    for name in ("reward_curves.png", "held_out.png"):
        assert (tmp_path / name).stat().st_size > 1000

    # the RL benchmark's per-phase breakdown of the demo runs, on these warm-started models
    bench_rl = load_script(ROOT / "benchmarks" / "bench_rl.py", "marljax_bench_rl")
    demo = bench_rl.demo_breakdown(0, 1, tmp_path, methods=("mars2_heterogeneous",), **QUICK)
    assert demo["models"] == f"the SFT checkpoints of {tmp_path}"
    assert set(demo["runs"]) == {"demo_mars2_heterogeneous"}  # the run with both families
    for r in demo["runs"].values():
        assert r["seconds_per_step"] > 0 and abs(sum(r["share"].values()) - 1) < 1e-6
        assert r["programs_per_step"] > 0 and r["seconds"]["sampling"] > 0 and r["seconds"]["update"] > 0


def test_demo_refuses_a_directory_made_with_other_settings(tmp_path, capsys):
    # A quick run's tiny models must never be resumed as if they were the full demo's.
    import json

    from marljax.demo.__main__ import main

    (tmp_path / "settings.json").write_text(json.dumps({"sft_steps": 16}))
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert str(tmp_path / "settings.json") in err and "other settings" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["settings.json"]  # nothing else was started


def test_cli_dispatches_demo(capsys):
    from marljax import cli

    with pytest.raises(SystemExit):
        cli.main(["fly"])  # not a command: argparse names the valid ones
    assert "invalid choice" in capsys.readouterr().err


# Each notebook's execution time in this test on a shared 2-core VM (the suite's XLA settings, see
# conftest; `python notebooks/execute.py` without them takes longer): the training notebook compiles
# a model's SFT, sampling and RL programs (39-64 s, by the machine's load).
NOTEBOOK_SECONDS = {"kernels.ipynb": 17, "tools.ipynb": 4, "training.ipynb": 60}


def load_notebook_runner():
    """notebooks/execute.py: the tests execute the notebooks as it does when it stores their outputs."""
    return load_script(ROOT / "notebooks" / "execute.py", "notebooks_execute")


def test_every_notebook_has_a_time():
    assert sorted(NOTEBOOK_SECONDS) == sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize(
    "name", [pytest.param(name, marks=pytest.mark.slow(seconds=s)) for name, s in NOTEBOOK_SECONDS.items()]
)
def test_notebook_executes(name):
    pytest.importorskip("nbformat", reason="notebook tests need the [test] extra")
    pytest.importorskip("nbclient", reason="notebook tests need the [test] extra")
    # Any failed assert in a cell raises CellExecutionError here.
    load_notebook_runner().execute(ROOT / "notebooks" / name)


@pytest.mark.parametrize("name", sorted(NOTEBOOK_SECONDS))
def test_notebook_is_stored_with_its_outputs(name):
    """Every code cell was run, in order, and saved with what it printed and drew, so that a reader
    sees the outputs without running anything (`python notebooks/execute.py --save` refreshes them)."""
    nbformat = pytest.importorskip("nbformat", reason="notebook tests need the [test] extra")
    cells = [c for c in nbformat.read(ROOT / "notebooks" / name, as_version=4).cells if c.cell_type == "code"]
    assert [c.execution_count for c in cells] == list(range(1, len(cells) + 1))
    for c in cells:
        shown = "plt.show()" in c.source or "print(" in c.source
        assert c.outputs or not shown, c.source
        assert all(o.output_type != "error" for o in c.outputs)
        if "plt.show()" in c.source:  # drawn inline, not lost to a non-interactive backend
            assert any("image/png" in o.get("data", {}) for o in c.outputs), c.source
