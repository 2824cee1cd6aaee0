"""The experiment scripts (`experiments/`, not a package) import as top-level modules here, as they
import their shared `_common` when run."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "experiments"))
