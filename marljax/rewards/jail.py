"""The ``unshare`` level's filesystem: a minimal root, built by the harness (or the zygote, once per
sandbox) as root in fresh mount/pid/ipc namespaces, before privileges are dropped.  Standard
library only; loaded by ``harness.py`` from beside itself; never imported by marljax.

The program sees what bubblewrap shows and nothing else of the host:

* /usr, /bin, /sbin, /lib* and the directories in ``jail["show"]`` (the interpreter's prefix, the
  harness's directory), read-only at their host paths;
* its working directory /sandbox (also on /tmp and /var/tmp): a tmpfs whose size and file count are its disk quota
  (``size_workdir``), emptied between the programs of a fork server (``empty_workdir``);
* a fresh /proc for its pid namespace, a /dev of null, zero, full, random, urandom, a small tmpfs
  /dev/shm, and /dev/mqueue (its IPC namespace's POSIX message queues, so that a fork server sees
  what a program left there);
* no host socket, FIFO or file elsewhere: the old root is detached after ``pivot_root``.
"""

import ctypes
import os
import platform

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT = 1, 2, 4, 8, 32
_MS_BIND, _MS_REC = 4096, 16384
_MNT_DETACH = 2
_KEPT_OPTIONS = {b"nosuid": _MS_NOSUID, b"nodev": _MS_NODEV, b"noexec": _MS_NOEXEC}
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217, "riscv64": 41}
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_DEVICES = ("null", "zero", "full", "random", "urandom")
_LIBC = ctypes.CDLL(None, use_errno=True)


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(src, target, fstype, flags, data=None):
    def enc(s):
        return None if s is None else os.fsencode(s)

    ret = _LIBC.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data))
    _check(ret, f"mount {src} on {target}")


def _mount_flags():
    """{mount point: its nosuid/nodev/noexec flags}: a read-only rebind must keep them (a user
    namespace may not clear them)."""
    out = {}
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            fields = line.split()
            point = fields[4]
            for code in (b"\\040", b"\\011", b"\\012", b"\\134"):  # mountinfo escapes these as octal
                point = point.replace(code, bytes([int(code[1:], 8)]))
            flags = 0
            for option in fields[5].split(b","):
                flags |= _KEPT_OPTIONS.get(option, 0)
            out[os.fsdecode(point)] = flags
    return out


def _flags_of(path, mounts):
    best = max((p for p in mounts if path == p or path.startswith(p.rstrip("/") + "/")), key=len)
    return mounts[best]


def _bind_ro(fd, target, flags):
    _mount(f"/proc/self/fd/{fd}", target, None, _MS_BIND | _MS_REC)
    _mount(None, target, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | flags)


WORKDIR = "/sandbox"  # the program's working directory, HOME and TMPDIR inside the jail (as bwrap's)


def build(jail):
    """Build the root in a fresh tmpfs, ``pivot_root`` into it and detach the host's; cwd: WORKDIR."""
    mounts = _mount_flags()
    shown = []  # (path, O_PATH fd): opened before anything is covered
    for d in list(_SYSTEM_DIRS) + list(jail.get("show", [])):
        if os.path.isdir(d) and not any(d == s or d.startswith(s + "/") for s, _ in shown):
            shown.append((d, os.open(d, os.O_PATH | os.O_DIRECTORY)))
    devices = [(n, os.open(f"/dev/{n}", os.O_PATH)) for n in _DEVICES if os.path.exists(f"/dev/{n}")]
    new = "/tmp" if os.path.isdir("/tmp") else "/mnt"  # any directory: the mount is ours alone
    _mount("tmpfs", new, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755,size=256k")
    for d, fd in shown:
        if os.path.islink(d) and d in _SYSTEM_DIRS:  # e.g. /bin -> usr/bin on a merged /usr
            os.symlink(os.readlink(d), new + d)
            continue
        os.makedirs(new + d, mode=0o755, exist_ok=True)
        _bind_ro(fd, new + d, _flags_of(d, mounts))
    # The working directory: a tmpfs (its size and file count are the program's disk quota, set by
    # ``size_workdir`` per program), also on /tmp and /var/tmp unless a shown directory lies below
    # them (a checkout or virtual environment under /tmp): those stay read-only, holding just it.
    os.mkdir(new + WORKDIR, 0o700)
    _mount("tmpfs", new + WORKDIR, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0700,size=64m,nr_inodes=4096")
    for tmp in ("/tmp", "/var/tmp"):
        if not any(d.startswith(tmp + "/") for d, _ in shown):
            os.makedirs(new + tmp, mode=0o755)
            _mount(new + WORKDIR, new + tmp, None, _MS_BIND)
    os.mkdir(new + "/dev", 0o755)
    for name, fd in devices:
        open(f"{new}/dev/{name}", "w").close()
        _mount(f"/proc/self/fd/{fd}", f"{new}/dev/{name}", None, _MS_BIND)
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
    ):
        os.symlink(target, f"{new}/dev/{name}")
    os.symlink("/proc/self/fd/2", f"{new}/dev/stderr")
    os.mkdir(new + "/dev/shm")
    _mount("tmpfs", new + "/dev/shm", "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777,size=1m")
    os.mkdir(new + "/dev/mqueue")
    _mount("mqueue", new + "/dev/mqueue", "mqueue", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    os.mkdir(new + "/proc")
    _mount("proc", new + "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    for fd in [fd for _, fd in shown] + [fd for _, fd in devices]:
        os.close(fd)
    os.mkdir(new + "/.old")
    _check(
        _LIBC.syscall(_SYS_PIVOT_ROOT[platform.machine()], os.fsencode(new), os.fsencode(new + "/.old")),
        "pivot_root",
    )
    os.chdir("/")
    _check(_LIBC.umount2(b"/.old", _MNT_DETACH), "umount /.old")
    os.rmdir("/.old")
    _mount(None, "/", None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)  # the root itself: no writes
    os.chdir(WORKDIR)


def size_workdir(megabytes, files, owner):
    """One program's disk quota on its working directory (remounted: a fork server's programs may
    differ), owned by ``owner`` ((uid, gid) or None)."""
    _mount(
        None,
        WORKDIR,
        None,
        _MS_REMOUNT | _MS_NOSUID | _MS_NODEV,
        f"size={int(megabytes)}m,nr_inodes={int(files)}",
    )
    if owner is not None:
        os.chown(WORKDIR, *owner)


def empty_workdir():
    """Remove what a program left in its working directory; False when something could not be removed."""
    import shutil

    ok = True
    for entry in os.scandir(WORKDIR):
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
        except (OSError, RecursionError):
            ok = False
    return ok


# ------------------------------------------------------------------ system calls no program needs
# Kernel keyrings outlive a program (per-uid keyrings accumulate in the kernel) and a user namespace
# would hand it capabilities over its own mounts: both are refused, at every isolation level.
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_NR = {  # add_key, request_key, keyctl, unshare, setns, clone, clone3
    "x86_64": (248, 249, 250, 272, 308, 56, 435),
    "aarch64": (217, 218, 219, 97, 268, 220, 435),
}
_CLONE_NEWUSER = 0x10000000
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06


class _Filter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_ushort),
        ("jt", ctypes.c_ubyte),
        ("jf", ctypes.c_ubyte),
        ("k", ctypes.c_uint),
    ]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Filter))]


def deny_syscalls():
    """Install a seccomp filter: keyring calls, ``unshare``, ``setns`` and ``clone`` with
    CLONE_NEWUSER fail with EPERM; ``clone3`` (whose flags a filter cannot read) with ENOSYS, so
    that the C library falls back to ``clone``.  Needs no_new_privs (the harness sets it).  False
    on an architecture it does not know."""
    arch = platform.machine()
    if arch not in _NR:
        return False
    add_key, request_key, keyctl, unshare, setns, clone, clone3 = _NR[arch]
    # (code, k, jump-if-true label, jump-if-false label); labels: "allow", "eperm", "enosys", None = next
    code = [
        (_LD_ABS, 4, None, None),  # seccomp_data.arch
        (_JEQ, _AUDIT_ARCH[arch], None, "allow"),
        (_LD_ABS, 0, None, None),  # seccomp_data.nr
        (_JGE, 0x40000000, "eperm", None),  # the x32 ABI's numbers
        *[(_JEQ, nr, "eperm", None) for nr in (add_key, request_key, keyctl, unshare, setns)],
        (_JEQ, clone3, "enosys", None),
        (_JEQ, clone, None, "allow"),
        (_LD_ABS, 16, None, None),  # the low half of args[0]: clone's flags
        (_JSET, _CLONE_NEWUSER, "eperm", "allow"),
    ]
    ends = {"allow": len(code), "eperm": len(code) + 1, "enosys": len(code) + 2}
    rets = [_RET_ALLOW, _RET_ERRNO | 1, _RET_ERRNO | 38]  # EPERM, ENOSYS
    insns = (_Filter * (len(code) + 3))()
    for i, (op, k, jt, jf) in enumerate(code):
        insns[i] = _Filter(op, ends[jt] - i - 1 if jt else 0, ends[jf] - i - 1 if jf else 0, k)
    for j, ret in enumerate(rets):
        insns[len(code) + j] = _Filter(_RET, 0, 0, ret)
    prog = _Program(len(insns), insns)
    _check(_LIBC.prctl(22, 2, ctypes.byref(prog), 0, 0), "seccomp")  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
    return True
