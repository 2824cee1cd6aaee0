"""The warm-started rise checks the `test_tool_rise_*` files share: after SFT on a sloppy teacher
(`marljax.demo.tools.warm_started_run`) a short RL run raises the team's reward by more than the
run-to-run spread measured across seeds and machines (benchmarks/RESULTS.md), and the logged
rollouts show the tool calls and what the tools answered. The rise is measured on a fixed set of
problems the team plays before and after RL with the same seeds (`check_gain`): fresh problems of its
world, or for the grid team its 8 training grids; the training rewards of single steps swing too
much between steps for a criterion that holds over seeds. xdist hands whole files to a
worker: SHARP's and the grid workflow's files run on different workers. Dr. MAS's search team,
the same recipe as a shipped config (`configs/dr_mas_search_sft_tiny.yaml`), is checked on the
README's CLI run of it (tests/train/test_tiny_configs_learn.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from marljax.train import rollout_log

# what a tool result looks like in each workflow's logged rollouts
RESULT = {"dr_mas_search": "[search] [1]", "sharp_tools": "[search] [1]", "at_grpo_tools": "[check_plan]"}


def warm_started_records(
    kinds: list[str],
    out,
    seed: int,
    rl_steps: int,
    evaluate: dict[str, int] | None = None,
    evaluate_on: str = "fresh",
) -> dict[str, list[dict]]:
    """`warm_started_run` of each workflow in `kinds`, one after the other into `out/<kind>`, in one
    child process compiled at LLVM optimisation level 1: these runs are execution-bound, the test
    suite's level-0 compiles (tests/conftest.py) double them, and level 1 runs as fast as XLA's
    default (2) and compiles quicker. The runs share no state but JAX's compiled programs, so each
    one's rewards are those of a run alone. `evaluate`: kind -> problems its team plays before and
    after RL (`out/<kind>/evaluation.json`), `evaluate_on` which (`warm_started_run`'s)."""
    env = {**os.environ, "XLA_FLAGS": "--xla_backend_optimization_level=1"}
    code = (
        "import json, sys; from pathlib import Path; from marljax.demo.tools import warm_started_run\n"
        "for kind in sys.argv[1].split(','):\n"
        "    out, n = Path(sys.argv[2], kind), json.loads(sys.argv[5]).get(kind, 0)\n"
        "    r = warm_started_run(\n"
        "        kind, out, seed=int(sys.argv[3]), rl_steps=int(sys.argv[4]), evaluate=n, evaluate_on=sys.argv[6]\n"
        "    )\n"
        "    (out / 'records.json').write_text(json.dumps(r))"
    )
    subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            ",".join(kinds),
            str(out),
            str(seed),
            str(rl_steps),
            json.dumps(evaluate or {}),
            evaluate_on,
        ],
        env=env,
        check=True,
        timeout=1500,
    )
    return {kind: json.loads((out / kind / "records.json").read_text()) for kind in kinds}


def check_gain(kind: str, records: list[dict], out, *, steps: int, margin: float) -> None:
    """The team reward of `kind`'s run (directory `out`) on its fixed evaluation problems after RL
    exceeds that before RL by `margin`, and the logged rollouts hold tool calls and tool results."""
    assert len(records) == steps
    evaluation = json.loads((out / "evaluation.json").read_text())
    before, after = evaluation["before"], evaluation["after"]
    assert before < 1.0 - margin, evaluation  # the warm start leaves room to rise
    assert after - before > margin, (evaluation, [r["team/reward"] for r in records])
    check_tool_calls(kind, out, steps)


def check_tool_calls(kind: str, out, steps: int) -> None:
    """The rollouts logged every 5 steps hold tool calls and what the tools answered."""
    logged = [r for s in range(5, steps + 1, 5) for r in rollout_log.read_step(out / "run", s)]
    text = "\n".join(r["prompt"] + r["completion"] for r in logged)
    assert "<tool_call>" in text and RESULT[kind] in text
