"""Working directories of sandboxed programs: made private, handed to a throw-away uid, removed
however deep a program made them."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile

from .isolation import SandboxConfig


def rmtree(path: str) -> None:
    """Remove a tree a program left, however deep (``shutil.rmtree`` recurses once per level)."""

    def onerror(func, p, exc_info):
        try:
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    try:
        shutil.rmtree(path, onerror=onerror)
    except RecursionError:
        _flatten(path)
        shutil.rmtree(path, onerror=onerror)


def _flatten(path: str) -> None:
    """Move every directory below ``path`` up into one directory of ``path``: no tree is deeper than 3
    then, and every path stays short.  Symbolic links are moved as they are, never followed."""
    flat = tempfile.mkdtemp(dir=path)
    pending, n = [path], 0
    while pending:
        parent = pending.pop()
        with contextlib.suppress(OSError):
            os.chmod(parent, 0o700)
        try:
            entries = [e for e in os.scandir(parent) if e.is_dir(follow_symlinks=False) and e.path != flat]
        except OSError:
            continue
        for entry in entries:
            moved = os.path.join(flat, str(n))
            n += 1
            try:
                os.rename(entry.path, moved)
            except OSError:
                continue
            pending.append(moved)


def hand_to_throwaway_uid(config: SandboxConfig, workdir: str, drop: bool) -> dict | None:
    """With ``drop``: a freshly drawn throw-away uid now owns ``workdir``; the payload's ``drop``
    ids (None without ``drop``)."""
    if not drop:
        return None
    uid = config.uid_base + secrets.randbelow(config.uid_span)
    os.chown(workdir, uid, uid)
    return {"uid": uid, "gid": uid}


def make_workdir(config: SandboxConfig) -> tuple[str, str]:
    """(base, workdir): a fresh base directory others may only traverse, the private working directory inside."""
    base = tempfile.mkdtemp(prefix="marljax-sbx-", dir=config.tmp_root)
    try:
        os.chmod(base, 0o711)
        workdir = os.path.join(base, "work")
        os.mkdir(workdir, 0o700)
    except BaseException:
        rmtree(base)
        raise
    return base, workdir
