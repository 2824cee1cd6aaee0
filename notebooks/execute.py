"""Execute notebooks as the tests do, and with --save store them with their outputs.

    python notebooks/execute.py --save                 # every notebook here, outputs stored in place
    python notebooks/execute.py notebooks/training.ipynb  # execute only (a failed cell is an error)

The kernel runs in this directory (the notebooks' relative paths start here) and imports the
marljax of this checkout (its root goes first on PYTHONPATH), whichever marljax is installed.
Timing metadata is not recorded, so that a re-executed notebook differs only where its outputs do.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def execute(path: Path, timeout: int = 600):
    """The notebook at `path`, executed (nbformat's NotebookNode); a failing cell raises CellExecutionError."""
    import nbclient
    import nbformat

    notebook = nbformat.read(path, as_version=4)
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *([old] if old else [])])
    try:  # the kernel inherits the environment as it starts
        nbclient.NotebookClient(
            notebook,
            timeout=timeout,
            kernel_name="python3",
            record_timing=False,
            resources={"metadata": {"path": str(path.parent)}},
        ).execute()
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old
    return notebook


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every notebook in notebooks/")
    parser.add_argument("--save", action="store_true", help="write each executed notebook back in place")
    args = parser.parse_args(argv)
    import nbformat

    for path in args.notebooks or sorted(HERE.glob("*.ipynb")):
        start = time.perf_counter()
        notebook = execute(path.resolve())
        if args.save:
            nbformat.write(notebook, path)
        print(f"{path}: executed in {time.perf_counter() - start:.0f} s" + (", saved" if args.save else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
