"""Starting JAX's backends once, at a command's start, without libtpu's start-up noise.

With libtpu installed (the `test` extra brings it) but no TPU on the machine, the first backend
initialisation prints C++ log lines to file descriptor 2 ("could not determine TPU accelerator
type", "unexpected worker hostname", a source location trace) that no environment variable
silences and that say nothing about a CPU or GPU run. `start` initialises the backends with fd 2
redirected to a temporary file (`quiet_libtpu`) and writes back every captured line but those,
which are dropped only on a machine without TPU chips (on a TPU machine they would be news). The
`marljax` commands and the demo call it first thing, so the backends start nowhere else.

`start` also turns on XLA's persistent compilation cache (`compilation_cache_dir`): a resumed run,
`marljax eval` after `train`, or a rerun loads the programs an earlier command compiled for the
same shapes instead of compiling them again (on a CPU most of a tiny run's time; on a TPU pod,
minutes at every restart).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile

from marljax.train import distributed

logger = logging.getLogger(__name__)

# libtpu's lines when it finds no TPU; the trace header is generic (absl), so it is dropped only
# when libtpu's own source file follows it
_LIBTPU_LINES = re.compile(
    rb"Failed to find host bounds for accelerator type: WARNING: could not determine TPU accelerator type"
    rb"|WARNING: Logging before InitGoogle\(\) is written to STDERR"
    rb"|^E\d{4} .*\] INVALID_ARGUMENT: Error: unexpected worker hostname .*TPU_WORKER_HOSTNAMES"
    rb"|^\S*libtpu_init_utils\.cc:\d+$"
)
_TRACE_HEADER = b"=== Source Location Trace: ==="


def without_libtpu_noise(captured: bytes) -> bytes:
    """`captured` (stderr's bytes) less libtpu's start-up lines for a machine without a TPU."""
    lines = captured.splitlines(keepends=True)
    kept = []
    for i, line in enumerate(lines):
        text = line.strip()
        if _LIBTPU_LINES.search(text):
            continue
        following = lines[i + 1].strip() if i + 1 < len(lines) else b""
        if text == _TRACE_HEADER and _LIBTPU_LINES.search(following):
            continue
        kept.append(line)
    return b"".join(kept)


@contextlib.contextmanager
def quiet_libtpu():
    """Run the block with file descriptor 2 captured, then write back what it printed, less
    libtpu's start-up lines when the machine has no TPU. If the block raises, everything is
    written back: the lines may explain the error."""
    sys.stderr.flush()  # what Python wrote before stays ahead of the captured lines
    saved = os.dup(2)
    keep_all = True
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
            # chips on the PCI bus, the test distributed.py makes too: it starts no backend
            keep_all = distributed._on_tpu_vm()
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            captured = capture.read()
            rest = memoryview(captured if keep_all else without_libtpu_noise(captured))
            while rest:
                rest = rest[os.write(2, rest) :]


# names a directory for the cache, or "off"
CACHE_ENV = "MARLJAX_XLA_CACHE"
# the size (GiB) the cache is pruned to at start
CACHE_MAX_ENV = "MARLJAX_XLA_CACHE_MAX_GB"
DEFAULT_CACHE_MAX_GB = 10.0


def compilation_cache_dir(environ=os.environ) -> str | None:
    """Where `start` keeps XLA's compilation cache: MARLJAX_XLA_CACHE's directory, none if it is
    "off", else $XDG_CACHE_HOME/marljax/xla (~/.cache/marljax/xla). None as well when JAX's own
    JAX_COMPILATION_CACHE_DIR is set: JAX has read it and uses that directory."""
    if environ.get("JAX_COMPILATION_CACHE_DIR"):
        return None
    chosen = environ.get(CACHE_ENV, "")
    if chosen.lower() == "off":
        return None
    if chosen:
        return chosen
    cache_home = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache_home, "marljax", "xla")


def prune_compilation_cache(path: str, max_bytes: int) -> int:
    """Delete the least recently used files of the cache directory `path` until the rest hold at
    most `max_bytes`; the number deleted. Last use is a file's access or modification time,
    whichever is later (JAX writes an entry once and reads it on every hit; Linux's default
    `relatime` records a read at least once a day). JAX's own size bound cannot be used: its
    eviction needs an access-time file beside every entry, and a directory holding one entry
    without (written by another process or an earlier version) makes every cache write fail."""
    entries = []
    with os.scandir(path) as it:
        for entry in it:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if entry.is_file(follow_symlinks=False):
                entries.append((max(st.st_atime, st.st_mtime), st.st_size, entry.path))
    total = sum(size for _, size, _ in entries)
    deleted = 0
    for _, size, file in sorted(entries):
        if total <= max_bytes:
            break
        try:
            os.remove(file)
        except FileNotFoundError:  # another process pruned it first
            total -= size
            continue
        except OSError:  # not ours to delete: it stays, and counts
            continue
        total -= size
        deleted += 1
    return deleted


def cache_max_bytes(environ=os.environ) -> int:
    """MARLJAX_XLA_CACHE_MAX_GB's bound on the compilation cache in bytes (default 10 GiB)."""
    raw = environ.get(CACHE_MAX_ENV, "")
    try:
        gib = float(raw) if raw else DEFAULT_CACHE_MAX_GB
    except ValueError:
        raise ValueError(f"{CACHE_MAX_ENV}={raw!r}: expected a size in GiB, e.g. 10") from None
    if not 0 <= gib < float("inf"):
        raise ValueError(f"{CACHE_MAX_ENV}={raw!r}: expected a finite size in GiB >= 0")
    return int(gib * 2**30)


def use_compilation_cache() -> None:
    """Turn on XLA's persistent compilation cache (before anything compiles). Every program is
    kept, however quickly it compiled (JAX's default keeps those over 1 s; a tiny run's are
    mostly under), unless JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS says otherwise; the directory
    is first pruned to MARLJAX_XLA_CACHE_MAX_GB (`prune_compilation_cache`). A directory that
    cannot be made leaves the cache off: it saves time, the run does not need it."""
    import jax

    path = compilation_cache_dir()
    if path is not None:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:
            logger.warning("XLA compilation cache off: cannot make %s (%s)", path, e)
            return
        deleted = prune_compilation_cache(path, cache_max_bytes())
        if deleted:
            logger.info("XLA compilation cache %s: %d least recently used entries deleted", path, deleted)
        jax.config.update("jax_compilation_cache_dir", path)
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def start() -> None:
    """Initialise JAX's backends now, quietly (`quiet_libtpu`), with the compilation cache on
    (`use_compilation_cache`). A multi-process run joins its runtime first
    (`distributed.initialize`): JAX refuses to once a backend has started."""
    import jax

    use_compilation_cache()
    with quiet_libtpu():
        jax.devices()
