"""Keep freed host memory inside the process, so XLA:CPU steps stop faulting their buffers in.

XLA:CPU allocates each execution's buffers afresh. glibc serves blocks above
32 MiB (and any block too big for a thread arena's 64 MiB heap) with `mmap`
and gives them back to the kernel on `free`, so every train step touches its
whole working set as new pages, and in a VM faulting them in can cost more
kernel time than the step's arithmetic (benchmarks/RESULTS.md, "Train step
after the matmul and host-memory changes"). With one arena, no `mmap` and no
trimming, freed blocks are reused and a step takes none.

glibc reads these settings once, at process start (the arena limit is fixed
as soon as a second thread allocates), so they cannot be applied from inside
a running program: the entry points (`python -m marljax.demo`, the `marljax`
command, `benchmarks/run.py`) start themselves again with them set. The
process keeps its peak memory until it exits. `MARLJAX_KEEP_HOST_MEMORY=0`
opts out; a malloc variable you set yourself is left as you set it.
"""

from __future__ import annotations

import os
import platform
import sys

ENV = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}
SWITCH = "MARLJAX_KEEP_HOST_MEMORY"


def kept_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """`environ` (default: this process's) with the settings added where not already set."""
    environ = dict(os.environ if environ is None else environ)
    return {**ENV, **environ, SWITCH: "1"}


def default_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """`environ` (default: this process's) without the settings, opted out: glibc's defaults."""
    environ = os.environ if environ is None else environ
    return {**{k: v for k, v in environ.items() if k not in ENV}, SWITCH: "0"}


def restart_with_kept_memory(argv: list[str]) -> None:
    """Replace this process by `python argv...` with the settings, unless already done, opted
    out of, or not on Linux with glibc. Call it first thing in an entry point: argv is, e.g.,
    `["-m", "marljax.demo", *sys.argv[1:]]`."""
    if os.environ.get(SWITCH) is not None or sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *argv], kept_env())


def refault_pages(megabytes: int = 256) -> int:
    """Minor page faults taken by writing a fresh `megabytes` block after one of the same size
    was written and freed, in a new thread as XLA's are: ~0 with the settings, megabytes x 256
    (4 KiB pages) without."""
    import ctypes
    import resource
    import threading

    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    size, faults = megabytes << 20, []

    def twice():
        for _ in range(2):
            before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            block = libc.malloc(size)
            if not block:
                raise MemoryError(f"malloc({size}) failed")
            ctypes.memset(block, 1, size)
            faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
            libc.free(block)

    thread = threading.Thread(target=twice)
    thread.start()
    thread.join()
    return faults[-1]


if __name__ == "__main__":  # python -m marljax.host_memory: show the settings and their effect
    import json

    restart_with_kept_memory(["-m", "marljax.host_memory", *sys.argv[1:]])
    print(
        json.dumps({**{k: os.environ.get(k) for k in (*ENV, SWITCH)}, "refault_pages_256mb": refault_pages()})
    )
