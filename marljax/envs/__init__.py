"""Environments the workflows drive: the state, the prompts and the reward of a task.

`Env` (roles, start, request, step) is the protocol of turn-based workflows;
`TextEnv` (reset, step: text in, text out) the one of multi-turn episodes such
as tool use (`tool_env`, with the tools of `tools` and the tasks of `tasks`);
`code.CodeEnv` (coder + tester) and `grid.PlanEnv` (the grid game) implement
it. `joint` holds MAGRPO's joint-answer tasks, `coop_code` the helper + main
coding task among them.
"""

from marljax.envs.base import Env, EnvSpec, StepResult, TextEnv, TurnResult, best_branch

__all__ = ["Env", "EnvSpec", "StepResult", "TextEnv", "TurnResult", "best_branch"]
