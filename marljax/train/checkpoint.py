"""Checkpoints of a multi-policy RL run that survive a crash at any moment.

On-disk layout (all paths absolute)::

    RUN_DIR/checkpoints/<step>/     one orbax CheckpointManager, one composite item per policy
      <policy>/...                  the policy state pytree (orbax StandardSave, OCDBT)
      loop/metadata                 the loop state (orbax JsonSave), data iterator included
      _CHECKPOINT_METADATA, commit_success.txt, ...                        (orbax)
      marljax_manifest.json         ours: size + sha256 of every file above

The loop state is one JSON document: the data stream's grain iterator state
(`ProblemStream.get_state`) travels in it with the buffers and workflow state.

Orbax does the writing: each step goes into `<step>.orbax-checkpoint-tmp-*`
and is renamed to `<step>` once every item is written, so a killed writer
leaves only tmp directories (never taken for steps; removed before the next
writer's first save). Ours, on top:

* Manifest. After orbax's commit a background thread (process 0) writes the
  step's manifest (temp file + fsync + `os.replace`, after fsync of every file
  it lists), so it marks data that is complete and durable; the next `save`,
  `wait`, `restore` and `close` wait for that thread and re-raise its error. A
  step counts only if its manifest's files all exist with the recorded sizes
  and (on restore) sha256: bit flips and truncations that orbax might read
  without error are caught. Extra files are ignored. `latest_step` and
  pruning only stat files; `restore` re-hashes the step it restores on every
  process (the price of not trusting the storage).
* Restore. Steps are tried newest first; one that is incomplete, corrupted or
  that orbax fails to read is reported (logging + warnings, with step, path
  and reason) and the next older one is tried; None when none works. Arrays
  are placed with the shardings of the abstract target. A complete step (its
  manifest verifies) newer than the one restored that orbax cannot read is
  damage the manifest could not see (storage that lied when it was hashed):
  process 0 moves it to ``RUN_DIR/set_aside/checkpoint-<step>.<time>`` and
  says so, since it would fail every later restore and block the save of its
  step number. When no step restores, complete steps that do not are left in
  place and are an error (most likely another configuration's).
* Retention. Orbax's `max_to_keep` stays off because orbax deletes old steps
  as soon as the new one is committed, before its manifest exists (with
  keep=1 a crash then leaves no complete step), and it counts steps that the
  manifest rejects. Once a step's manifest is written, process 0 keeps the
  newest `keep` complete steps and deletes every older step directory
  (manifest first, so a half-deleted directory never looks complete), but
  step 0 with `keep_step_zero` (a run's warm start, which later runs start
  from).
* Leftovers. A step at or after the first step a process saves is a leftover
  of a crashed or abandoned timeline: if incomplete or corrupted it is
  deleted (with the tmp directories) before that save; if it is a complete,
  valid checkpoint, `save` raises instead of overwriting it (e.g. a writer
  that did not restore first; a step that failed to restore is set aside).
* Multi-host: orbax coordinates the array writes; the manifest, pruning and
  leftover deletion run on `jax.process_index() == 0`, every process makes
  the same read-only decisions, and a barrier precedes the manager's reload.
  Tested with two processes in tests/scale/test_scale_multiprocess.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import threading
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from marljax.train.files import report, set_aside_path

logger = logging.getLogger(__name__)

MANIFEST = "marljax_manifest.json"
LOOP = "loop"
_TMP_MARK = ".orbax-checkpoint-tmp"
_RESERVED = (LOOP, "metrics")  # orbax stores tracked metrics as an item named "metrics"


def _primary() -> bool:
    return jax.process_index() == 0


def _barrier(name: str) -> None:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def _data_files(step_dir: str) -> list[str]:
    """Relative paths of every file under `step_dir` except our manifest (and its temp files)."""
    out = []
    for root, _, files in os.walk(step_dir):
        for name in files:
            rel = os.path.relpath(os.path.join(root, name), step_dir)
            if not rel.startswith(MANIFEST):
                out.append(rel)
    return sorted(out)


def _digest(path: str, sync: bool = False) -> tuple[int, str]:
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
        if sync:  # the manifest must never be durable before the data it vouches for
            os.fsync(f.fileno())
    return size, h.hexdigest()


def write_manifest(step_dir: str, step: int) -> None:
    """Record size + sha256 of every file of a committed step directory, atomically."""
    files = {rel: list(_digest(os.path.join(step_dir, rel), sync=True)) for rel in _data_files(step_dir)}
    tmp = os.path.join(step_dir, f"{MANIFEST}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump({"format": 1, "step": step, "files": files}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(step_dir, MANIFEST))
    fd = os.open(step_dir, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def manifest_problem(step_dir: str, step: int, *, hashes: bool = True) -> tuple[str, str] | None:
    """(path, reason) why `step_dir` is not a complete copy of `step` per its manifest, or None."""
    try:
        with open(os.path.join(step_dir, MANIFEST)) as f:
            manifest = json.load(f)
        files = {rel: (int(size), str(sha)) for rel, (size, sha) in manifest["files"].items()}
        if manifest["step"] != step or not files:
            return step_dir, "manifest does not describe this step"
    except FileNotFoundError:
        return step_dir, "no manifest: the save of this step did not finish"
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return step_dir, f"unreadable manifest ({type(e).__name__}: {e})"
    for rel, (size, _) in files.items():  # cheap checks first
        path = os.path.join(step_dir, rel)
        try:
            actual = os.path.getsize(path)
        except OSError:
            return path, "missing file"
        if actual != size:
            return path, f"file has {actual} bytes, manifest says {size}"
    if hashes:
        for rel, (_, sha) in files.items():
            path = os.path.join(step_dir, rel)
            if _digest(path)[1] != sha:
                return path, "checksum mismatch"
    return None


def _restore_target(x: Any) -> Any:
    # A concrete jax.Array stands for its own shape, dtype and placement.
    if isinstance(x, jax.Array):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
    return x


def _snapshot(x: Any) -> Any:
    # An async save reads numpy buffers later; copy so the caller may mutate its own.
    return np.array(x, copy=True) if isinstance(x, np.ndarray) else x


class RunCheckpointer:
    """Checkpoints of every policy's state plus the loop state, saved and restored as one step."""

    def __init__(
        self,
        run_dir: str | os.PathLike,
        policy_names: Sequence[str],
        *,
        keep: int = 3,
        keep_step_zero: bool = False,
        async_save: bool = True,
    ):
        names = list(policy_names)
        if not names or len(set(names)) != len(names):
            raise ValueError(f"policy_names must be non-empty and unique, got {names}")
        for n in names:
            if not isinstance(n, str) or n in _RESERVED or not n or n[0] in "._" or os.sep in n:
                raise ValueError(f"policy name {n!r} is not a plain directory name other than {_RESERVED}")
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.policy_names = tuple(names)
        self.keep, self.keep_step_zero = keep, keep_step_zero
        self.async_save = async_save
        self.directory = os.path.abspath(os.path.join(os.fspath(run_dir), "checkpoints"))
        # (a step directory is all digits: a policy named so cannot tell the layouts apart)
        old = [
            n for n in (*names, LOOP) if not n.isdigit() and os.path.isdir(os.path.join(self.directory, n))
        ]
        if old:  # a run directory of the layout before one manager: its steps would be ignored
            raise FileExistsError(
                f"{self.directory} holds checkpoints in the older per-policy layout ({', '.join(old)}/<step>/), "
                "which this version does not read: resume that run with the marljax version that wrote it, "
                "or use a new run directory"
            )
        options = ocp.CheckpointManagerOptions(
            max_to_keep=None,  # retention is ours (see module docstring)
            enable_async_checkpointing=async_save,
            cleanup_tmp_directories=False,  # a reader must not delete a live writer's tmp dirs
            lightweight_initialize=True,  # do not parse every step's metadata (may be corrupt) at start
            create=True,
        )
        # Explicit handlers fix the items' formats up front instead of guessing them from disk.
        handlers = {n: ocp.StandardCheckpointHandler() for n in names}
        handlers[LOOP] = ocp.JsonCheckpointHandler()
        self._manager = ocp.CheckpointManager(
            self.directory, options=options, item_names=tuple(handlers), item_handlers=handlers
        )
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._last_saved: int | None = None
        self._closed = False

    def step_dir(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    def _steps(self) -> list[int]:
        """Every step directory, newest first (complete or not)."""
        try:
            entries = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        steps = (int(e) for e in entries if e.isdigit() and os.path.isdir(os.path.join(self.directory, e)))
        return sorted(steps, reverse=True)

    def _problem(self, step: int, *, hashes: bool) -> tuple[str, str] | None:
        return manifest_problem(self.step_dir(step), step, hashes=hashes)

    # ------------------------------------------------------------------ save
    def save(self, step: int, policy_states: Mapping[str, Any], loop_state: Mapping[str, Any]) -> None:
        """Save every policy's state and the loop state as `step`; returns while async writes go on."""
        step = int(step)
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        if set(policy_states) != set(self.policy_names):
            raise ValueError(
                f"policy_states keys {sorted(policy_states)} != policies {sorted(self.policy_names)}"
            )
        if not isinstance(loop_state, Mapping):
            raise TypeError(f"loop_state must be a dict, got {type(loop_state).__name__}")
        self.wait()
        if self._last_saved is None:
            self._clear_leftovers(step)
        elif step <= self._last_saved:
            raise ValueError(f"step {step} is not after the last saved step {self._last_saved}")
        items = {
            n: ocp.args.StandardSave(jax.tree.map(_snapshot, policy_states[n])) for n in self.policy_names
        }
        # Validates JSON-ability now (not in the background) and freezes the caller's mutable lists.
        items[LOOP] = ocp.args.JsonSave(json.loads(json.dumps(loop_state)))
        if not self._manager.save(step, args=ocp.args.Composite(**items)):
            raise RuntimeError(f"orbax declined to save step {step} under {self.step_dir(step)}")
        self._last_saved = step
        if self.async_save:
            self._thread = threading.Thread(target=self._finish, args=(step,), name=f"marljax-ckpt-{step}")
            self._thread.start()
        else:
            self._finish(step)
            self._raise_error()

    def _finish(self, step: int) -> None:
        """Wait for orbax's commit of `step`, then (process 0) write its manifest and prune."""
        try:
            self._manager.wait_until_finished()
            if _primary():
                write_manifest(self.step_dir(step), step)
                complete = [s for s in self._steps() if self._problem(s, hashes=False) is None]
                if len(complete) > self.keep:
                    for s in self._steps():
                        if s < complete[self.keep - 1] and not (s == 0 and self.keep_step_zero):
                            self._remove_step(s)
        except BaseException as e:  # re-raised by wait() on the caller's thread
            self._error = e

    def _remove_step(self, step: int) -> None:
        # The manifest goes first: from then on the step is incomplete whatever remains.
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(self.step_dir(step), MANIFEST))
        shutil.rmtree(self.step_dir(step), ignore_errors=True)

    def _clear_leftovers(self, step: int) -> None:
        """Before this process's first save: drop crash leftovers at >= `step`, refuse to overwrite a good step."""
        stale = [s for s in self._steps() if s >= step]
        for s in stale:
            if self._problem(s, hashes=True) is None:
                raise FileExistsError(
                    f"a complete checkpoint of step {s} already exists under {self.directory}; "
                    f"restore it, save a later step, or use a new run directory"
                )
        if _primary():
            for s in stale:
                self._remove_step(s)
            for entry in os.listdir(self.directory):
                if _TMP_MARK in entry:
                    shutil.rmtree(os.path.join(self.directory, entry), ignore_errors=True)
            for s in self._steps():  # manifest temp files of a writer killed mid-manifest
                for entry in os.listdir(self.step_dir(s)):
                    if entry.startswith(MANIFEST + ".tmp"):
                        os.remove(os.path.join(self.step_dir(s), entry))
        _barrier("marljax_checkpoint_leftovers")
        self._manager.reload()  # orbax refuses steps <= its cached latest step

    # ------------------------------------------------------------- wait/close
    def _raise_error(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def wait(self) -> None:
        """Block until the last save is written and marked complete; re-raise its error."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._raise_error()

    def close(self) -> None:
        if self._closed:
            return
        try:
            self.wait()
        finally:
            self._closed = True
            self._manager.close()

    def __enter__(self) -> RunCheckpointer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --------------------------------------------------------------- restore
    def latest_step(self) -> int | None:
        """Newest complete step (manifest present, file sizes match; not re-hashed)."""
        return next((s for s in self._steps() if self._problem(s, hashes=False) is None), None)

    def restore(
        self, abstract_policy_states: Mapping[str, Any], step: int | None = None
    ) -> tuple[int, dict[str, Any], dict[str, Any]] | None:
        """(step, policy_states, loop_state) of the newest restorable step, or None for a fresh run;
        with `step`, that step only (an error if it is not there or does not restore).

        `abstract_policy_states[name]` is a pytree of jax.ShapeDtypeStruct (with `.sharding` where
        the arrays must land), arrays (their own shape/dtype/sharding), numpy arrays or Python
        scalars; the result has its structure, including optax namedtuple types.
        """
        if set(abstract_policy_states) != set(self.policy_names):
            raise ValueError(
                f"abstract_policy_states keys {sorted(abstract_policy_states)} != policies {sorted(self.policy_names)}"
            )
        self.wait()
        items = {
            n: ocp.args.StandardRestore(jax.tree.map(_restore_target, abstract_policy_states[n]))
            for n in self.policy_names
        }
        items[LOOP] = ocp.args.JsonRestore()
        if step is not None:
            return self._restore_step(step, items)
        unreadable = []  # (step, error) of complete, verified steps that still do not restore
        for step in self._steps():
            where, complete = self.step_dir(step), False
            try:
                problem = self._problem(step, hashes=True)
                if problem:
                    where, reason = problem
                    raise RuntimeError(reason)
                complete = True
                got = self._read(step, items)
            except Exception as e:  # any failure of this step: report it and fall back
                msg = (
                    f"cannot restore checkpoint step {step} from {where}: {type(e).__name__}: {e}; "
                    f"falling back to an older step"
                )
                logger.warning(msg)
                warnings.warn(msg, RuntimeWarning, stacklevel=2)
                if complete:
                    unreadable.append((step, f"{type(e).__name__}: {e}"))
                continue
            self._set_aside(unreadable)
            return got
        if unreadable:
            # Starting afresh would only fail at the first save (a complete step is never overwritten).
            step, error = unreadable[0]
            raise RuntimeError(
                f"{self.directory} holds complete checkpoints that do not fit this run's policies "
                f"(another configuration, or another marljax version's optimiser state); use a new run "
                f"directory or the configuration that wrote them. Newest: step {step}: {error[:2000]}"
            )
        return None

    def check_step(self, step: int, hashes: bool = True) -> None:
        """Raise unless `step` is kept and complete (its files' sizes, and with `hashes` their
        contents, as its manifest records them): the error names the steps kept."""
        steps = self._steps()
        if step not in steps:
            kept = ", ".join(map(str, sorted(steps))) or "none"
            raise FileNotFoundError(f"{self.step_dir(step)}: no such checkpoint (steps kept: {kept})")
        problem = self._problem(step, hashes=hashes)
        if problem:
            where, reason = problem
            raise RuntimeError(f"checkpoint step {step} at {where} is not complete: {reason}")

    def _restore_step(self, step: int, items: dict) -> tuple[int, dict[str, Any], dict[str, Any]]:
        self.check_step(step)
        return self._read(step, items)

    def _read(self, step: int, items: dict) -> tuple[int, dict[str, Any], dict[str, Any]]:
        """(step, policy_states, loop_state) as orbax reads them, unchecked."""
        got = self._manager.restore(step, args=ocp.args.Composite(**items))
        return step, {n: got[n] for n in self.policy_names}, got[LOOP]

    def _set_aside(self, unreadable: list[tuple[int, str]]) -> None:
        """Move complete steps that failed to restore (newer than the one that did) out of the way."""
        if not unreadable:
            return
        if _primary():
            for step, error in unreadable:
                kept = set_aside_path(Path(self.directory).parent, f"checkpoint-{step}")
                shutil.move(self.step_dir(step), kept)  # a rename unless checkpoints/ is another disk
                report(
                    logger,
                    f"checkpoint step {step} passes its manifest but does not restore ({error[:2000]}): "
                    f"moved to {kept}, so that the run goes on from an older step and can save step {step} again",
                )
        _barrier("marljax_checkpoint_set_aside")
        self._manager.reload()  # forget the moved steps
