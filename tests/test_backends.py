"""Commands start JAX's backends without libtpu's start-up lines on a machine without a TPU
(marljax/backends.py), and keep every other line; with XLA's persistent compilation cache on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tpu_target import needs_libtpu

from marljax.backends import (
    cache_max_bytes,
    compilation_cache_dir,
    prune_compilation_cache,
    without_libtpu_noise,
)
from marljax.train.distributed import _on_tpu_vm

REPO = Path(__file__).resolve().parents[1]

# what libtpu 0.0.42 printed on this repository's CPU machines at jax's first backend start
NOISE = [
    "Failed to find host bounds for accelerator type: WARNING: could not determine TPU accelerator type, "
    "please set env var `TPU_ACCELERATOR_TYPE` manually, otherwise libtpu.so may not properly initialize.",
    "WARNING: Logging before InitGoogle() is written to STDERR",
    "E0000 00:00:1795895925.731213   28952 common_lib.cc:554] INVALID_ARGUMENT: Error: unexpected worker "
    "hostname 'WARNING: could not determine TPU worker hostnames or IP addresses' from env var "
    "TPU_WORKER_HOSTNAMES. Expecting a valid hostname or IP address without port number, or "
    "hostname:port:address triple.",
    "=== Source Location Trace: === ",
    "learning/45eac/tfrc/runtime/libtpu_init_utils.cc:327",
]
# the lines that mark the noise; the trace header is absl's own and says nothing alone
MARKERS = [
    "Failed to find host bounds",
    "Logging before InitGoogle",
    "unexpected worker hostname",
    "libtpu_init_utils.cc",
]

no_tpu_here = pytest.mark.skipif(
    _on_tpu_vm(), reason="this machine has TPU chips: libtpu prints no such noise"
)


def test_the_filter_drops_libtpu_lines_only():
    other = [
        "W0000 00:00:1.0 12 cpu_client.cc:1] some other XLA warning",
        "=== Source Location Trace: ===",  # another library's trace: kept with its location
        "third_party/xla/pjrt/foo.cc:12",
        "WARNING: could be anyone's",
    ]
    captured = "\n".join([other[0], *NOISE, *other[1:]]) + "\n"
    assert without_libtpu_noise(captured.encode()).decode() == "\n".join(other) + "\n"
    # bytes that are not UTF-8 pass through untouched
    assert without_libtpu_noise(b"\xff\xfe odd\n") == b"\xff\xfe odd\n"


def _env(**extra) -> dict:
    # jax probes libtpu unless JAX_PLATFORMS says otherwise; and libtpu, when another process holds
    # its machine-wide lock, loads no further and prints nothing unless told to load anyway
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    return {**env, "PYTHONPATH": str(REPO), "ALLOW_MULTIPLE_LIBTPU_LOAD": "1", **extra}


def _run(*argv: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *argv], cwd=REPO, env=_env(**env), capture_output=True, text=True, timeout=600
    )


@no_tpu_here
def test_a_command_that_starts_jax_prints_no_libtpu_lines(tmp_path):
    # `export` builds the run's policy (JAX's backends start) before it finds no checkpoint
    run = tmp_path / "run"
    run.mkdir()
    config = {
        "name": "t",
        "run_dir": str(run),
        "policies": {"main": {"model": {"preset": "tiny-qwen3"}}},
        "agents": {"solver": {"policy": "main"}},
        "data": {"source": {"kind": "synthetic", "n_train": 4}, "batch_size": 2},
        "train": {"steps": 1, "progress": False, "log_to": []},
    }
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    got = _run("-m", "marljax.cli", "export", str(run), "--policy", "main", str(tmp_path / "out"))
    assert got.returncode == 1 and got.stderr.endswith(f"{run}: no complete checkpoint to export\n"), (
        got.stderr
    )
    assert not [marker for marker in MARKERS if marker in got.stderr], got.stderr
    assert "Source Location Trace" not in got.stderr


@needs_libtpu
@no_tpu_here
def test_plain_jax_prints_the_lines_the_commands_drop():
    # the other half of the test above: without marljax's start, the lines are there
    got = _run("-c", "import jax; jax.devices()")
    assert got.returncode == 0, got.stderr
    for marker in MARKERS:
        assert marker in got.stderr, got.stderr


@needs_libtpu
@no_tpu_here
def test_a_failed_start_writes_back_everything_and_raises():
    got = _run("-c", "from marljax import backends; backends.start()", JAX_PLATFORMS="tpu")
    assert got.returncode == 1
    assert "RuntimeError: Unable to initialize backend 'tpu'" in got.stderr
    for marker in MARKERS:  # kept: they may explain the error
        assert marker in got.stderr, got.stderr


def test_the_compilation_cache_directory_follows_the_environment():
    assert compilation_cache_dir({}) == os.path.join(os.path.expanduser("~"), ".cache", "marljax", "xla")
    assert compilation_cache_dir({"XDG_CACHE_HOME": "/c"}) == "/c/marljax/xla"
    assert compilation_cache_dir({"MARLJAX_XLA_CACHE": "/mine", "XDG_CACHE_HOME": "/c"}) == "/mine"
    assert compilation_cache_dir({"MARLJAX_XLA_CACHE": "OFF"}) is None
    # JAX's own setting wins: JAX reads it itself
    assert compilation_cache_dir({"JAX_COMPILATION_CACHE_DIR": "/j", "MARLJAX_XLA_CACHE": "/mine"}) is None


def test_pruning_deletes_the_least_recently_used_entries_down_to_the_bound(tmp_path):
    # five entries of 1,000 bytes last used at t = 10, 20, ..., 50 s; the first written last but read
    # most recently (its access time is the later one)
    for i, name in enumerate("abcde"):
        path = tmp_path / f"jit_{name}-cache"
        path.write_bytes(b"x" * 1000)
        os.utime(path, (10 * (i + 1), 10 * (i + 1)))
    os.utime(tmp_path / "jit_a-cache", (60, 5))
    assert prune_compilation_cache(str(tmp_path), 2500) == 3  # 5,000 bytes -> 2,000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jit_a-cache", "jit_e-cache"]
    assert prune_compilation_cache(str(tmp_path), 2000) == 0  # at the bound: nothing to do
    assert prune_compilation_cache(str(tmp_path), 0) == 2


def test_the_cache_bound_comes_from_the_environment():
    assert cache_max_bytes({}) == 10 * 2**30
    assert cache_max_bytes({"MARLJAX_XLA_CACHE_MAX_GB": "0.5"}) == 2**29
    for bad in ("ten", "-1", "nan", "inf"):
        with pytest.raises(ValueError, match=f"MARLJAX_XLA_CACHE_MAX_GB='{bad}'"):
            cache_max_bytes({"MARLJAX_XLA_CACHE_MAX_GB": bad})


def test_a_second_process_loads_what_the_first_compiled(tmp_path):
    cache = tmp_path / "xla"
    script = (
        "from marljax import backends; backends.start()\n"
        "import jax, jax.numpy as jnp\n"
        "print(jax.jit(lambda x: jnp.cumsum(x * 3 + 1))(jnp.arange(5.0)).tolist())"
    )
    env = {
        k: v
        for k, v in _env().items()
        if not k.startswith("JAX_PERSISTENT_CACHE") and k != "JAX_COMPILATION_CACHE_DIR"
    }

    def run():
        got = subprocess.run(
            [sys.executable, "-c", script],
            cwd=REPO,
            env={
                **env,
                "MARLJAX_XLA_CACHE": str(cache),
                "MARLJAX_XLA_CACHE_MAX_GB": str(2**19 / 2**30),  # 512 KiB
                "JAX_PLATFORMS": "cpu",
                "JAX_LOG_COMPILES": "1",
            },
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert got.returncode == 0, got.stderr
        return got, sorted(p.name for p in cache.iterdir())

    # an entry of an earlier run, unused for long, that takes the cache past its bound: pruned
    cache.mkdir()
    (cache / "jit_old-cache").write_bytes(b"x" * 2**20)
    os.utime(cache / "jit_old-cache", (0, 0))
    first, kept = run()
    assert "jit_old-cache" not in kept
    # every program, however quick to compile (JAX's default threshold would keep none of these)
    assert any("jit_" in name for name in kept), kept
    second, kept_again = run()
    assert second.stdout == first.stdout == "[1.0, 5.0, 12.0, 22.0, 35.0]\n"
    assert "Persistent compilation cache hit for 'jit_" in second.stderr, second.stderr
    assert kept_again == kept  # nothing compiled anew
