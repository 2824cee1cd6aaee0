"""Environments the workflows drive: the state, the prompts and the reward of a task.

`TextEnv` (reset, step: text in, text out) is the protocol of multi-turn
episodes such as tool use (`tool_env`, with the tools of `tools` and the tasks
of `tasks`). `code.CodeEnv` (coder + tester) and `grid.PlanEnv` (the grid game)
score AT-GRPO's tree: K candidates per role in a batch, one `TurnResult` per
problem, whose best branch continues. `joint` holds MAGRPO's joint-answer tasks, `coop_code` the helper + main
coding task among them.
"""

from marljax.envs.base import EnvSpec, StepResult, TextEnv, TurnResult, best_branch

__all__ = ["EnvSpec", "StepResult", "TextEnv", "TurnResult", "best_branch"]
