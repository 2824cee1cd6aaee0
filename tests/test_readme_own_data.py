"""The README's "Your own data and model" block runs as written (issue 41): a random checkpoint
written by the one-liner, `check-data` on the example rows, two training steps of the config that
reads them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from marljax.tasks.files import load_problems

ROOT = Path(__file__).resolve().parents[1]
HEADING = "### Your own data and model"


def block() -> list[str]:
    lines = (ROOT / "README.md").read_text().splitlines()
    start = lines.index("```bash", lines.index(HEADING))
    return [line for line in lines[start + 1 : lines.index("```", start)] if line.strip()]


def test_the_example_rows_are_one_of_each_code_schema():
    problems = load_problems(ROOT / "examples" / "code_problems.jsonl")
    assert {p.schema for p in problems} == {"mbpp", "stdio"}


@pytest.mark.slow(seconds=90)
def test_the_block_runs_as_written(tmp_path):
    for name in ("configs", "examples"):
        (tmp_path / name).symlink_to(ROOT / name)
    script = tmp_path / "own_data.sh"
    script.write_text("\n".join(block()) + "\n")
    bin_dir = str(Path(sys.executable).parent)  # the `marljax` entry point of this environment
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ["PATH"], "MARLJAX_KEEP_HOST_MEMORY": "0"}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run(
        ["bash", "-e", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "6 of 6 reference answers pass all their tests" in out.stdout
    assert "own_data: step 2 of 2" in out.stdout
    assert (tmp_path / "runs" / "own_data" / "checkpoints").is_dir()
