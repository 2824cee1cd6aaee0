"""Isolation levels of the code sandbox: how a child process is wrapped.

Levels, strongest first (``sandbox.detect_isolation`` probes them once per process):

``bwrap``    bubblewrap: new net/pid/ipc/uts namespaces, a read-only view of
             only /usr, /lib*, /bin and the interpreter's prefix, the working
             directory bind-mounted on /sandbox and /tmp, nothing else
             writable; the sandbox dies with its parent.
``unshare``  util-linux unshare (needs root or unprivileged user namespaces):
             new net/pid/mount/ipc/uts namespaces and a minimal root entered with
             pivot_root (``jail.py``): the system directories and the interpreter
             read-only, the working directory a sized tmpfs on /sandbox (and /tmp, /var/tmp),
             a fresh /proc, a small /dev; ``unshare`` dies with the thread that
             started it (``setpriv --pdeathsig``).
``none``     rlimits, scrubbed environment, process-group kill only (named, never
             picked by ``auto``).

Every level also gets the harness's seccomp filter (no keyrings, no user namespaces) and, where
this process may make one, a memory cgroup (``cgroup.py``).
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path

from .results import Isolation

HARNESS_PATH = str(Path(__file__).with_name("harness.py").resolve())
# loaded by the harness from beside it
JUDGE_PATH = str(Path(__file__).with_name("judge.py").resolve())
JAIL_PATH = str(Path(__file__).with_name("jail.py").resolve())
LEVELS = ("bwrap", "unshare", "none")
ISOLATING_LEVELS = LEVELS[:-1]  # what ``auto`` may pick: ``none`` only when named


@dataclass(frozen=True)
class SandboxConfig:
    """How programs are started.

    isolation: ``"auto"`` (the strongest of ``bwrap`` and ``unshare`` that works here) or one of
      ``LEVELS``; no working level, or a named level that does not work here, is an error, never a
      silent downgrade (``"none"``, rlimits only, must be named).
      Default: ``$MARLJAX_SANDBOX_ISOLATION`` or ``"auto"``.
    python: interpreter for the child (default: this one).
    site_packages: let programs import installed third-party packages (slower
      start-up: ``site`` is imported); default stdlib only (``python -I -S``).
    drop_privileges: when running as root, run programs as a throw-away uid.
    tmp_root: where working directories are created (default: the system temp dir).
    fork_server: each ``SandboxPool`` worker keeps one sandboxed interpreter warm
      and forks it per program (see ``fork_server.py``) instead of starting the
      sandbox and Python per program; on the ``bwrap`` level, and on ``unshare``
      where programs run as a throw-away uid (``forks_programs``).
    """

    isolation: str = field(default_factory=lambda: os.environ.get("MARLJAX_SANDBOX_ISOLATION", "auto"))
    python: str = sys.executable
    site_packages: bool = False
    drop_privileges: bool = True
    tmp_root: str | None = None
    fork_server: bool = True
    uid_base: int = 200_000
    uid_span: int = 1 << 20

    def __post_init__(self) -> None:
        if self.isolation not in ("auto",) + LEVELS:
            raise ValueError(
                f"SandboxConfig.isolation must be 'auto' or one of {LEVELS}, got {self.isolation!r}"
            )


def is_root() -> bool:
    return os.geteuid() == 0


def _prefixes(config: SandboxConfig) -> list[str]:
    """Directories the child interpreter needs to read (deduplicated, outermost)."""
    exe = os.path.realpath(config.python)
    paths = {
        os.path.dirname(exe),
        os.path.realpath(sys.base_prefix),
        os.path.realpath(sys.prefix),
        os.path.realpath(sys.exec_prefix),
    }
    paths.add(os.path.realpath(sysconfig.get_paths()["stdlib"]))
    if config.site_packages:
        for key in ("purelib", "platlib"):
            paths.add(os.path.realpath(sysconfig.get_paths()[key]))
    out = []
    for p in sorted(paths, key=len):
        if not os.path.isdir(p):
            continue
        if any(p == q or p.startswith(q.rstrip("/") + "/") for q in out):
            continue
        out.append(p)
    return out


def _blocked_ancestor(path: str) -> str | None:
    """Outermost ancestor of ``path`` that 'other' users cannot traverse."""
    parts = Path(path).parts
    for k in range(2, len(parts) + 1):
        p = str(Path(*parts[:k]))
        try:
            mode = os.stat(p).st_mode
        except OSError:
            return None
        if not mode & stat.S_IXOTH:
            return p
    return None


_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


def child_env(level: str, workdir: str) -> dict[str, str]:
    """The environment a sandboxed program starts with (nothing of ours is inherited). Home and
    temp directory are the working directory where the program sees it: bubblewrap binds it on
    /sandbox and /tmp, the unshare jail makes a tmpfs on /sandbox (/tmp too, unless a checkout or
    environment under /tmp must show there), and without isolation it is at its host path."""
    inside = {"bwrap": ("/sandbox", "/tmp"), "unshare": ("/sandbox", "/sandbox")}
    home, tmp = inside.get(level, (workdir, workdir))
    return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": home, "TMPDIR": tmp}


def bwrap_argv(
    config: SandboxConfig,
    workdir: str,
    drop: bool,
    files: dict[str, str],
    args: list[str],
    caps: tuple[str, ...] = (),
    env: tuple[tuple[str, str], ...] = (),
) -> list[str]:
    """bubblewrap around ``python args...``; ``files`` maps read-only binds (inside path -> host path);
    ``env``: extra environment variables.

    With ``drop`` (as root) the sandbox keeps CAP_SETUID/CAP_SETGID so the harness can
    switch to the throw-away uid, plus any extra ``caps``; bwrap drops every other one.
    """
    argv = [
        "bwrap",
        "--die-with-parent",
        "--new-session",
        "--unshare-net",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
    ]
    if is_root():
        if drop:
            for cap in ("CAP_SETUID", "CAP_SETGID") + caps:
                argv += ["--cap-add", cap]
    else:
        argv += ["--unshare-user"]
    for d in _SYSTEM_DIRS:
        if os.path.islink(d):
            argv += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            argv += ["--ro-bind", d, d]
    made: set[str] = {"/"}
    for p in _prefixes(config):
        if any(
            p == d or p.startswith(d + "/")
            for d in _SYSTEM_DIRS
            if os.path.isdir(d) and not os.path.islink(d)
        ):
            continue
        parts = Path(p).parts
        for k in range(2, len(parts)):
            anc = str(Path(*parts[:k]))
            if anc not in made:
                argv += ["--perms", "0755", "--dir", anc]
                made.add(anc)
        argv += ["--ro-bind", p, p]
    argv += [
        "--dev",
        "/dev",
        "--mqueue",  # the IPC namespace's POSIX message queues, for the fork server's check
        "/dev/mqueue",
        "--proc",
        "/proc",
        "--bind",
        workdir,
        "/sandbox",
        "--bind",
        workdir,
        "/tmp",
        "--chdir",
        "/sandbox",
    ]
    for inside, host in files.items():
        argv += ["--ro-bind", host, inside]
    argv += ["--clearenv"]
    for name, value in [*child_env("bwrap", workdir).items(), *env]:
        argv += ["--setenv", name, value]
    argv += ["--"]
    # Without site-packages the real interpreter is all we need; a venv's own
    # path may sit under /tmp, which the working directory hides.
    python = config.python if config.site_packages else os.path.realpath(config.python)
    return argv + [python, "-I", "-B"] + ([] if config.site_packages else ["-S"]) + args


def bwrap_harness_argv(config: SandboxConfig, workdir: str, payload: str, drop: bool) -> list[str]:
    """One fresh sandboxed interpreter running the harness on one payload file."""
    files = {
        "/.marljax_harness.py": HARNESS_PATH,
        "/.marljax_judge.py": JUDGE_PATH,
        "/.marljax_jail.py": JAIL_PATH,
        "/.payload.json": payload,
    }
    return bwrap_argv(config, workdir, drop, files, ["/.marljax_harness.py", "/.payload.json"])


def python_argv(config: SandboxConfig, args: list[str]) -> list[str]:
    """The sandbox's interpreter running ``args`` (a script and its arguments)."""
    return [config.python, "-I", "-B"] + ([] if config.site_packages else ["-S"]) + args


def unshare_argv(config: SandboxConfig, args: list[str]) -> list[str]:
    """``python args...`` as pid 1 of fresh pid/net/mount/ipc/uts namespaces (and a user namespace
    when not root), killed when ``unshare`` dies, which dies with the thread that started it
    (``setpriv --pdeathsig``: a SIGKILLed parent leaves no sandbox behind)."""
    argv = ["setpriv", "--pdeathsig", "KILL"] if shutil.which("setpriv") else []
    argv += [
        "unshare",
        "--net",
        "--pid",
        "--fork",
        "--kill-child",
        "--mount",
        "--propagation",
        "private",
        "--ipc",
        "--uts",
    ]
    if not is_root():
        argv += ["--user", "--map-root-user"]
    return argv + python_argv(config, args)


def jail_spec(config: SandboxConfig) -> dict:
    """What the ``unshare`` level's minimal root shows besides the system directories (``jail.py``):
    the interpreter's prefixes and the harness's directory, read-only."""
    return {"show": _prefixes(config) + [os.path.dirname(HARNESS_PATH)]}


def _others_can_read(config: SandboxConfig) -> bool:
    return all(_blocked_ancestor(p) is None for p in _prefixes(config))


def level_isolation(level: str, config: SandboxConfig) -> Isolation:
    drop = will_drop(level, config)
    if level == "bwrap":
        return Isolation("bwrap", True, True, drop, True, "bubblewrap namespaces; read-only system view")
    if level == "unshare":
        return Isolation(
            "unshare",
            True,
            True,
            drop,
            drop or not is_root(),
            "util-linux unshare: net/pid/mount namespaces; a minimal root, /sandbox a sized tmpfs",
        )
    return Isolation(
        "none",
        False,
        False,
        drop,
        False,
        "rlimits + scrubbed env + process-group kill only; network NOT denied",
    )


def forks_programs(isolation: Isolation) -> bool:
    """Whether a fork server can keep this level's promises.  Under ``unshare`` without root the
    programs would share the zygote's user namespace and its capabilities in it (they could unmount
    the jail that the next program relies on), so that case starts a fresh sandbox per program."""
    return isolation.level == "bwrap" or (isolation.level == "unshare" and isolation.privileges_dropped)


def will_drop(level: str, config: SandboxConfig) -> bool:
    if not (is_root() and config.drop_privileges):
        return False
    if level in ("bwrap", "unshare"):
        return True
    return _others_can_read(config)


def kill_uid(uid: int) -> None:
    """Kill every process whose real uid is ``uid`` (a throw-away sandbox uid)."""
    for _ in range(3):
        found = False
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if os.stat(f"/proc/{entry}").st_uid != uid:
                    continue
                os.kill(int(entry), signal.SIGKILL)
                found = True
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
        if not found:
            return
        time.sleep(0.01)
