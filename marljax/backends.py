"""Starting JAX's backends once, at a command's start, without libtpu's start-up noise.

With libtpu installed (the `test` extra brings it) but no TPU on the machine, the first backend
initialisation prints C++ log lines to file descriptor 2 ("could not determine TPU accelerator
type", "unexpected worker hostname", a source location trace) that no environment variable
silences and that say nothing about a CPU or GPU run. `start` initialises the backends with fd 2
redirected to a temporary file (`quiet_libtpu`) and writes back every captured line but those,
which are dropped only on a machine without TPU chips (on a TPU machine they would be news). The
`marljax` commands and the demo call it first thing, so the backends start nowhere else.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile

from marljax.train import distributed

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


def start() -> None:
    """Initialise JAX's backends now, quietly (`quiet_libtpu`). A multi-process run joins its
    runtime first (`distributed.initialize`): JAX refuses to once a backend has started."""
    import jax

    with quiet_libtpu():
        jax.devices()
