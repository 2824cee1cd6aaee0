"""Environments the workflows drive: the state, the prompts and the reward of a task.

`Env` (roles, start, request, step) is the protocol of turn-based workflows;
`code.CodeEnv` (coder + tester) and `grid.PlanEnv` (the grid game) implement
it. `joint` holds MAGRPO's joint-answer tasks, `coop_code` the helper + main
coding task among them.
"""

from marljax.envs.base import Env, TurnResult, best_branch

__all__ = ["Env", "TurnResult", "best_branch"]
