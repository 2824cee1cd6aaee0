"""Agents, policies, buffers, update step, checkpoints, data, loop."""
