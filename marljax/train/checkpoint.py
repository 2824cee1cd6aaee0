"""Checkpoints of a multi-policy RL run that survive a crash at any moment.

On-disk layout (all paths absolute)::

    RUN_DIR/checkpoints/
      <policy>/<step>/              one orbax CheckpointManager per policy
        default/...                 the policy state pytree (orbax StandardSave, OCDBT)
        _CHECKPOINT_METADATA, commit_success.txt          (orbax)
        marljax_manifest.json       ours: size + sha256 of every file above
      loop/<step>/
        default/metadata            the loop state (orbax JsonSave)
        ..., marljax_manifest.json

Design:

* Writes. Orbax writes each step into `<step>.orbax-checkpoint-tmp-*` and
  renames it to `<step>` once complete, so a killed writer leaves only tmp
  directories (never taken for steps; removed by the next writer's first
  save). `save` starts every manager's (asynchronous) write and returns; a
  background thread then waits for all of them and, on process 0 only, writes
  the manifest of each step directory (temp file + fsync + `os.replace`), then
  prunes old steps. The manifest is written as soon as the data is committed
  (not at the next save), so a crash during the following training steps
  keeps the step. The next `save`, `wait`, `restore` and `close` wait for
  that thread and re-raise its error, if any.
* Completeness. A step counts only if it has a directory in EVERY manager,
  each with a manifest for that step whose files all exist with the recorded
  sizes and (on restore) sha256. The manifest is written after orbax's commit
  and after fsync of every file it lists, so it marks data that is complete
  and durable; bit flips and truncations that orbax might read without error
  are caught by the hashes. Extra files in a step directory are ignored.
  Cost: `latest_step` and pruning only stat files; `restore` re-hashes the
  step it restores (all of its bytes once, on every process: fine for a few
  GB, the price of not trusting the storage for bigger states).
* Restore. Steps are tried newest first; a step that is incomplete,
  corrupted or that orbax fails to read is reported (logging + warnings, with
  step, path and reason) and the next older one is tried; None when none
  works. Arrays are placed with the shardings of the abstract target.
* Retention. Orbax's own `max_to_keep` is off: it decides per manager and can
  delete a manager's last complete step while another manager is still
  writing the newer one. Here, once a step is complete everywhere, process 0
  keeps the newest `keep` complete steps and deletes every older step
  directory (manifest first, so a half-deleted directory never looks
  complete).
* Leftovers. A step at or after the first step a process saves is a leftover
  of a crashed or abandoned timeline: if incomplete or corrupted it is
  deleted (with the tmp directories) before that save; if it is a complete,
  valid checkpoint, `save` raises instead of overwriting it (e.g. restore
  fell back because the abstract target no longer matches).
* Multi-host: orbax coordinates the array writes (each manager with its own
  barrier names); the manifest, pruning and leftover deletion run on
  `jax.process_index() == 0`, every process makes the same read-only
  decisions, and a barrier precedes the managers' reload. Tested with two
  processes in tests/scale/test_scale_multiprocess.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import threading
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

logger = logging.getLogger(__name__)

MANIFEST = "marljax_manifest.json"
LOOP = "loop"
_TMP_MARK = ".orbax-checkpoint-tmp"


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


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(step_dir: str, step: int) -> None:
    """Record size + sha256 of every file of a committed step directory, atomically."""
    files = {rel: list(_digest(os.path.join(step_dir, rel), sync=True)) for rel in _data_files(step_dir)}
    tmp = os.path.join(step_dir, f"{MANIFEST}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump({"format": 1, "step": step, "files": files}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(step_dir, MANIFEST))
    _fsync_dir(step_dir)


def manifest_problem(step_dir: str, step: int, *, hashes: bool = True) -> str | None:
    """Why `step_dir` is not a complete copy of `step` per its manifest, or None if it is."""
    try:
        with open(os.path.join(step_dir, MANIFEST)) as f:
            manifest = json.load(f)
        files = {rel: (int(size), str(sha)) for rel, (size, sha) in manifest["files"].items()}
        if manifest["step"] != step or not files:
            return "manifest does not describe this step"
    except FileNotFoundError:
        return "no manifest: the save of this step did not finish"
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return f"unreadable manifest ({type(e).__name__}: {e})"
    for rel, (size, _) in files.items():  # cheap checks first
        try:
            actual = os.path.getsize(os.path.join(step_dir, rel))
        except OSError:
            return f"missing file {rel}"
        if actual != size:
            return f"file {rel} has {actual} bytes, manifest says {size}"
    if hashes:
        for rel, (_, sha) in files.items():
            if _digest(os.path.join(step_dir, rel))[1] != sha:
                return f"checksum mismatch in {rel}"
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
        async_save: bool = True,
    ):
        names = list(policy_names)
        if not names or len(set(names)) != len(names):
            raise ValueError(f"policy_names must be non-empty and unique, got {names}")
        for n in names:
            if not isinstance(n, str) or n == LOOP or not n or n.startswith(".") or os.sep in n:
                raise ValueError(f"policy name {n!r} is not a plain directory name other than {LOOP!r}")
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.policy_names = tuple(names)
        self.keep = keep
        self.async_save = async_save
        self.directory = os.path.abspath(os.path.join(os.fspath(run_dir), "checkpoints"))
        options = ocp.CheckpointManagerOptions(
            max_to_keep=None,  # retention is ours (see module docstring)
            enable_async_checkpointing=async_save,
            cleanup_tmp_directories=False,  # a reader must not delete a live writer's tmp dirs
            lightweight_initialize=True,  # do not parse every step's metadata (may be corrupt) at start
            create=True,
        )
        self._managers: dict[str, ocp.CheckpointManager] = {}
        for n in (*names, LOOP):
            # Explicit handlers fix the single-item layout up front instead of guessing it from disk.
            handler = ocp.JsonCheckpointHandler() if n == LOOP else ocp.StandardCheckpointHandler()
            # Multi-host: the managers save the same step at once, so each needs its own barrier names
            # (orbax's default keys, e.g. `_async_commit_complete.<step>`, would collide).
            mp = ocp.options.MultiprocessingOptions(barrier_sync_key_prefix=f"marljax.{n}")
            self._managers[n] = ocp.CheckpointManager(
                os.path.join(self.directory, n),
                options=dataclasses.replace(options, multiprocessing_options=mp),
                item_handlers=handler,
            )
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._last_saved: int | None = None
        self._closed = False

    # ----------------------------------------------------------------- paths
    def step_dir(self, name: str, step: int) -> str:
        return os.path.join(self.directory, name, str(step))

    def _steps(self, name: str) -> set[int]:
        root = os.path.join(self.directory, name)
        try:
            return {int(e) for e in os.listdir(root) if e.isdigit() and os.path.isdir(os.path.join(root, e))}
        except FileNotFoundError:
            return set()

    def _step_problem(self, step: int, *, hashes: bool) -> tuple[str, str] | None:
        """(path, reason) for the first manager where `step` is not complete, else None."""
        for name in self._managers:
            path = self.step_dir(name, step)
            if not os.path.isdir(path):
                return path, f"step directory missing for {name!r}"
            reason = manifest_problem(path, step, hashes=hashes)
            if reason:
                return path, reason
        return None

    def _all_steps(self) -> list[int]:
        return sorted(set().union(*(self._steps(n) for n in self._managers)), reverse=True)

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
        # Validates JSON-ability now (not in the background) and freezes the caller's mutable lists.
        loop_copy = json.loads(json.dumps(loop_state))
        for name in self.policy_names:
            state = jax.tree.map(_snapshot, policy_states[name])
            self._save_one(name, step, ocp.args.StandardSave(state))
        self._save_one(LOOP, step, ocp.args.JsonSave(loop_copy))
        self._last_saved = step
        if self.async_save:
            self._thread = threading.Thread(target=self._finish, args=(step,), name=f"marljax-ckpt-{step}")
            self._thread.start()
        else:
            self._finish(step)
            self._raise_error()

    def _save_one(self, name: str, step: int, args: Any) -> None:
        if not self._managers[name].save(step, args=args):
            raise RuntimeError(f"orbax declined to save step {step} under {self.step_dir(name, step)}")

    def _finish(self, step: int) -> None:
        """Wait for the writes of `step`, then (process 0) write manifests and prune."""
        try:
            for mgr in self._managers.values():
                mgr.wait_until_finished()
            if _primary():
                for name in self._managers:
                    write_manifest(self.step_dir(name, step), step)
                self._prune()
        except BaseException as e:  # re-raised by wait() on the caller's thread
            self._error = e

    def _prune(self) -> None:
        complete = [s for s in sorted(self._all_steps()) if self._step_problem(s, hashes=False) is None]
        if len(complete) <= self.keep:
            return
        cutoff = complete[-self.keep]
        for s in self._all_steps():
            if s < cutoff:
                self._remove_step(s)

    def _remove_step(self, step: int) -> None:
        # Manifests go first: from then on the step is incomplete whatever remains.
        for name in self._managers:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(self.step_dir(name, step), MANIFEST))
        for name in self._managers:
            shutil.rmtree(self.step_dir(name, step), ignore_errors=True)

    def _clear_leftovers(self, step: int) -> None:
        """Before this process's first save: drop crash leftovers at >= `step`, refuse to overwrite a good step."""
        stale = [s for s in self._all_steps() if s >= step]
        for s in stale:
            if self._step_problem(s, hashes=True) is None:
                raise FileExistsError(
                    f"a complete checkpoint of step {s} already exists under {self.directory}; "
                    f"restore it, save a later step, or use a new run directory"
                )
        if _primary():
            for s in stale:
                self._remove_step(s)
            for name in self._managers:
                root = os.path.join(self.directory, name)
                for entry in os.listdir(root) if os.path.isdir(root) else ():
                    if _TMP_MARK in entry:
                        shutil.rmtree(os.path.join(root, entry), ignore_errors=True)
                for s in self._steps(name):  # manifest temp files of a writer killed mid-manifest
                    for entry in os.listdir(self.step_dir(name, s)):
                        if entry.startswith(MANIFEST + ".tmp"):
                            os.remove(os.path.join(self.step_dir(name, s), entry))
        _barrier("marljax_checkpoint_leftovers")
        for mgr in self._managers.values():
            mgr.reload()  # orbax refuses steps <= its cached latest step

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
            for mgr in self._managers.values():
                mgr.close()

    def __enter__(self) -> RunCheckpointer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --------------------------------------------------------------- restore
    def latest_step(self) -> int | None:
        """Newest step complete in every manager (manifests present, file sizes match; not re-hashed)."""
        for s in self._all_steps():
            if self._step_problem(s, hashes=False) is None:
                return s
        return None

    def restore(
        self, abstract_policy_states: Mapping[str, Any]
    ) -> tuple[int, dict[str, Any], dict[str, Any]] | None:
        """(step, policy_states, loop_state) of the newest restorable step, or None for a fresh run.

        `abstract_policy_states[name]` is a pytree of jax.ShapeDtypeStruct (with `.sharding` where
        the arrays must land), arrays (their own shape/dtype/sharding), numpy arrays or Python
        scalars; the result has its structure, including optax namedtuple types.
        """
        if set(abstract_policy_states) != set(self.policy_names):
            raise ValueError(
                f"abstract_policy_states keys {sorted(abstract_policy_states)} != policies {sorted(self.policy_names)}"
            )
        self.wait()
        unreadable = []  # complete, verified steps that still do not restore into this run's states
        for step in self._all_steps():
            where = self.directory
            complete = False
            try:
                problem = self._step_problem(step, hashes=True)
                if problem:
                    where, reason = problem
                    raise RuntimeError(reason)
                complete = True
                states = {}
                for name in self.policy_names:
                    where = self.step_dir(name, step)
                    target = jax.tree.map(_restore_target, abstract_policy_states[name])
                    states[name] = self._managers[name].restore(step, args=ocp.args.StandardRestore(target))
                where = self.step_dir(LOOP, step)
                loop_state = self._managers[LOOP].restore(step, args=ocp.args.JsonRestore())
                return step, states, loop_state
            except Exception as e:  # any failure of this step: report it and fall back
                msg = (
                    f"cannot restore checkpoint step {step} from {where}: {type(e).__name__}: {e}; "
                    f"falling back to an older step"
                )
                logger.warning(msg)
                warnings.warn(msg, RuntimeWarning, stacklevel=2)
                if complete:
                    unreadable.append(f"step {step}: {type(e).__name__}: {e}")
        if unreadable:
            # Starting afresh would only fail at the first save (a complete step is never overwritten).
            raise RuntimeError(
                f"{self.directory} holds complete checkpoints that do not fit this run's policies "
                f"(another configuration, or another marljax version's optimiser state); use a new run "
                f"directory or the configuration that wrote them. Newest: {unreadable[0][:2000]}"
            )
        return None
