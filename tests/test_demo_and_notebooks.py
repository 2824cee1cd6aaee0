"""The README's main command and the executed kernel notebook."""

import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_demo_team_learns(capsys):
    from marljax import demo

    assert demo.main(["--steps", "80", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    first, last = (float(x) for x in out.rsplit("first 10 steps ", 1)[1].split(" (")[0].split(" -> last 10 steps "))
    assert first < 0.4 and last > 0.8, out


def test_cli_dispatches_demo(capsys):
    from marljax import cli

    with pytest.raises(SystemExit):
        cli.main(["fly"])  # not a command: argparse names the valid ones
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb")))
def test_notebook_executes(name):
    nbformat = pytest.importorskip("nbformat", reason="notebook tests need the [test] extra")
    nbclient = pytest.importorskip("nbclient", reason="notebook tests need the [test] extra")
    notebook = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    # Any failed assert in a cell raises CellExecutionError here.
    nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
