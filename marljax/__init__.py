"""marljax: JAX-native multi-agent reinforcement learning for teams of LLM agents."""

__version__ = "0.1.0"
