"""Agents, policies, buffers, update step, checkpoints, data, loop (issue 6)."""
