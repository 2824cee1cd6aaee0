"""Fixtures shared across test packages: tiny random HF checkpoints, built once per session."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest


def pytest_configure(config):
    """One persistent XLA compilation cache for the session and the processes it starts (CLI
    runs, multi-device scripts): a program compiled in one of them is loaded by the others."""
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return
    path = tempfile.mkdtemp(prefix="marljax-test-xla-cache-")
    config._marljax_xla_cache = path
    os.environ["JAX_COMPILATION_CACHE_DIR"] = path
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.5"
    import jax

    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def pytest_unconfigure(config):
    path = getattr(config, "_marljax_xla_cache", None)
    if path:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """`checkpoint(name)` -> path of the tiny checkpoint `marljax.models.testing.CASES[name]` (built on first use)."""
    from marljax.models import testing

    made: dict[str, object] = {}

    def get(name: str, **extra):
        key = name + repr(sorted(extra.items()))
        if key not in made:
            family, overrides = testing.CASES[name]
            made[key] = testing.make_tiny_checkpoint(
                tmp_path_factory.mktemp(name), family, **{**overrides, **extra}
            )
        return made[key]

    return get


@pytest.fixture(scope="session")
def run_on_fake_devices():
    """`run(*python_args, devices=8)` -> CompletedProcess of a Python subprocess on simulated CPU devices.

    The device count is fixed when JAX starts, so multi-device checks run in a
    fresh interpreter with `--xla_force_host_platform_device_count`.
    """
    root = Path(__file__).resolve().parents[1]

    def run(*python_args: str, devices: int = 8) -> subprocess.CompletedProcess:
        env = dict(
            os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu"
        )
        env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
        return subprocess.run(
            [sys.executable, *python_args], env=env, capture_output=True, text=True, timeout=600
        )

    return run
