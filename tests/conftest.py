"""Fixtures shared across test packages: tiny random HF checkpoints, built once per session."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

MAX_MAPPINGS = 20_000
LEGACY_EMITTERS = "--xla_cpu_use_fusion_emitters=false"


def _known(flag: str) -> list[str]:
    """[flag] if this XLA accepts it, else [] (a process with an unknown XLA flag aborts)."""
    probe = subprocess.run(
        [sys.executable, "-c", "import jax; jax.numpy.zeros(1).block_until_ready()"],
        env={**os.environ, "XLA_FLAGS": flag, "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        timeout=120,
    )
    return [flag] if probe.returncode == 0 else []


def pytest_configure(config):
    """One persistent XLA compilation cache for the session, its xdist workers and the processes
    the tests start (CLI runs, multi-device scripts): many tests compile the same programs (the same
    tiny models through the same trainer), and a program compiled in one is loaded by the others.
    Set here, in the controller, before the workers start, so they inherit it through the
    environment; a cache the user set is left alone.

    Also, unless XLA_FLAGS is set, XLA:CPU's quickest code generation: the suite's time is mostly
    compiling small programs that then run a few times. LLVM's optimisation level 0 (XLA's own
    passes and the matmul libraries are the same at every level, so only the generated loops of
    elementwise code run slower), and XLA's older fusion emitters, which emit LLVM IR directly
    instead of lowering each fusion through MLIR (benchmarks/RESULTS.md has both A/Bs). The second
    flag is XLA-internal: where the installed XLA does not know it (it aborts on unknown flags),
    the tests run without it."""
    if "XLA_FLAGS" not in os.environ:
        os.environ["XLA_FLAGS"] = " ".join(["--xla_backend_optimization_level=0", *_known(LEGACY_EMITTERS)])
    # libtpu (the test extra's, for compiling TPU programs ahead of time) takes a machine-wide lock
    # when a process initialises it; the workers and their children each need it
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return
    path = tempfile.mkdtemp(prefix="marljax-test-xla-cache-")
    config._marljax_xla_cache = path
    os.environ["JAX_COMPILATION_CACHE_DIR"] = path
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.5"
    import jax

    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def pytest_collection_modifyitems(config, items):
    """The costliest files first: xdist hands whole files to its workers in collection order
    (`--dist loadfile --no-loadscope-reorder`; its own reordering puts the files with the most
    tests first), so the long ones start early and short files fill the end, instead of one worker
    finishing a long file alone while the other waits. A file's cost: its tests' `slow(seconds=...)`
    (a plain `slow` counts 10 seconds)."""
    cost: dict = {}
    for item in items:
        if marker := item.get_closest_marker("slow"):
            cost[item.path] = cost.get(item.path, 0) + marker.kwargs.get("seconds", 10)
    items.sort(key=lambda item: -cost.get(item.path, 0))


def pytest_unconfigure(config):
    path = getattr(config, "_marljax_xla_cache", None)
    if path:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def _release_compiled_programs():
    """Drop JAX's compiled programs after a test once the process maps many of them.

    XLA:CPU maps every executable's code into memory (about 9 mappings each) and JAX's caches keep
    every executable alive, so a worker that runs half the suite approaches the kernel's limit of
    65,530 mappings (vm.max_map_count), past which compiling aborts or segfaults inside XLA.
    Clearing only above a threshold keeps the programs that neighbouring tests share (one module
    of end-to-end runs added over 20,000 mappings, so the check runs after every test).
    """
    yield
    maps = Path("/proc/self/maps")
    if maps.exists() and maps.read_text().count("\n") > MAX_MAPPINGS:
        import gc

        import jax

        jax.clear_caches()
        gc.collect()


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """`checkpoint(name)` -> path of the tiny checkpoint `marljax.testing.CASES[name]` (built on first use)."""
    from marljax import testing

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
        flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}"
        env = dict(os.environ, XLA_FLAGS=flags.strip(), JAX_PLATFORMS="cpu")
        env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
        return subprocess.run(
            [sys.executable, *python_args], env=env, capture_output=True, text=True, timeout=600
        )

    return run
