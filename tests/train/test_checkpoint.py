"""RunCheckpointer: round trip, retention, corruption fallback, partial steps, SIGKILL, shardings."""

from __future__ import annotations

import logging
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from script_loader import load_script

from marljax.train.checkpoint import MANIFEST, RunCheckpointer

ROOT = Path(__file__).resolve().parents[2]
WRITER_PATH = Path(__file__).with_name("_checkpoint_writer.py")
writer = load_script(WRITER_PATH, "_checkpoint_writer")

POLICIES = ("proposer", "reviser")


def make_tx():
    sched = optax.warmup_cosine_decay_schedule(0.0, 1e-3, warmup_steps=5, decay_steps=50)
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(sched, weight_decay=0.1))


def policy_state(seed: int) -> dict:
    """Params, a real optax state after one update, and ints, all a function of `seed`."""
    k = jax.random.split(jax.random.key(seed), 3)
    params = {
        "embed": jax.random.normal(k[0], (16, 8), jnp.float32),
        "layers": {
            "0": {
                "w": jax.random.normal(k[1], (8, 8), jnp.float32),
                "b": jnp.full((8,), 0.5 * seed, jnp.float32),
            }
        },
    }
    tx = make_tx()
    opt_state = tx.init(params)
    grads = jax.tree.map(lambda p: jnp.sin(p * (seed + 1)), params)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    return {"params": params, "opt_state": opt_state, "step": jnp.int32(seed), "version": seed + 100}


def abstract(state):
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype) if isinstance(x, jax.Array) else x, state
    )


def loop_state(step: int) -> dict:
    return {
        "step": step,
        "keys": [[0, step], [7, 2**31 + step]],
        "prior": {"a": 0.1 * step, "b": [1.5, -2.25e-8]},
        "buffer": [{"text": f"sample {i} of step {step}", "reward": i / 3} for i in range(5)],
        "done": False,
    }


def save_steps(run_dir, steps, *, keep=3, keep_step_zero=False):
    with RunCheckpointer(run_dir, POLICIES, keep=keep, keep_step_zero=keep_step_zero) as ckpt:
        for s in steps:
            ckpt.save(s, {p: policy_state(10 * s + i) for i, p in enumerate(POLICIES)}, loop_state(s))


def restore(run_dir):
    with RunCheckpointer(run_dir, POLICIES) as ckpt:
        return ckpt.restore({p: abstract(policy_state(0)) for p in POLICIES})


def assert_same_tree(got, want):
    assert jax.tree.structure(got) == jax.tree.structure(want)  # treedefs compare node types too
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert type(g) is type(w)
        if isinstance(w, jax.Array):
            assert g.dtype == w.dtype and g.shape == w.shape
            assert np.asarray(g).tobytes() == np.asarray(w).tobytes()
        else:
            assert g == w


def step_dir(run_dir, name, step):
    """The directory of item `name` (a policy or "loop") in step `step`."""
    return Path(run_dir) / "checkpoints" / str(step) / name


def biggest_data_file(run_dir, name, step) -> Path:
    files = [p for p in step_dir(run_dir, name, step).rglob("*") if p.is_file()]
    return max(files, key=lambda p: p.stat().st_size)


@pytest.mark.parametrize("async_save", [True, False])
def test_round_trip_bit_exact_with_optax_types(tmp_path, async_save):
    states = {p: policy_state(i + 1) for i, p in enumerate(POLICIES)}
    loop = loop_state(3)
    with RunCheckpointer(tmp_path, POLICIES, async_save=async_save) as ckpt:
        assert ckpt.restore({p: abstract(s) for p, s in states.items()}) is None  # fresh run
        ckpt.save(3, states, loop)
    with RunCheckpointer(tmp_path, POLICIES) as ckpt:
        assert ckpt.latest_step() == 3
        step, got, got_loop = ckpt.restore({p: abstract(s) for p, s in states.items()})
    assert step == 3 and set(got) == set(POLICIES)
    for p in POLICIES:
        assert_same_tree(got[p], states[p])
        clip_state, adamw_state = got[p]["opt_state"]
        assert type(clip_state) is optax.EmptyState
        assert type(adamw_state[0]) is optax.ScaleByAdamState
        assert int(adamw_state[0].count) == 1
    assert got_loop == loop
    assert got_loop["keys"][1][1] == 2**31 + 3 and got_loop["prior"]["b"][1] == -2.25e-8


def test_keep_last_n_in_every_manager(tmp_path):
    save_steps(tmp_path, range(1, 6), keep=2)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["4", "5"]
    for name in (*POLICIES, "loop"):
        assert all(step_dir(tmp_path, name, s).is_dir() for s in (4, 5))
    assert restore(tmp_path)[0] == 5


def test_a_warm_start_at_step_zero_outlives_retention_and_restores_by_its_step(tmp_path):
    save_steps(tmp_path / "warm", range(0, 5), keep=2, keep_step_zero=True)
    assert sorted(os.listdir(tmp_path / "warm" / "checkpoints")) == ["0", "3", "4"]
    save_steps(tmp_path / "plain", range(0, 5), keep=2)
    assert sorted(os.listdir(tmp_path / "plain" / "checkpoints")) == ["3", "4"]
    with RunCheckpointer(tmp_path / "warm", POLICIES) as ckpt:
        target = {p: abstract(policy_state(0)) for p in POLICIES}
        assert ckpt.restore(target)[0] == 4
        step, got, loop = ckpt.restore(target, step=0)
        assert step == 0 and loop == loop_state(0)
        assert_same_tree(got["reviser"], policy_state(1))
        with pytest.raises(FileNotFoundError, match="steps kept: 0, 3, 4"):
            ckpt.restore(target, step=2)
    _corrupt_flip(biggest_data_file(tmp_path / "warm", "proposer", 0))
    with (
        RunCheckpointer(tmp_path / "warm", POLICIES) as ckpt,
        pytest.raises(RuntimeError, match="not complete"),
    ):
        ckpt.restore({p: abstract(policy_state(0)) for p in POLICIES}, step=0)


def _corrupt_truncate(path: Path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _corrupt_flip(path: Path):
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid : mid + 4] = bytes(b ^ 0xFF for b in data[mid : mid + 4])
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("corrupt", [_corrupt_truncate, _corrupt_flip])
def test_corrupted_latest_step_falls_back(tmp_path, caplog, corrupt):
    save_steps(tmp_path, [1, 2])
    bad = biggest_data_file(tmp_path, "reviser", 2)
    corrupt(bad)
    with caplog.at_level(logging.WARNING), pytest.warns(RuntimeWarning, match="step 2") as rec:
        step, got, loop = restore(tmp_path)
    assert step == 1 and loop == loop_state(1)
    assert_same_tree(got["reviser"], policy_state(11))
    assert any(str(step_dir(tmp_path, "reviser", 2)) in str(w.message) for w in rec)
    assert "step 2" in caplog.text


@pytest.mark.parametrize("corrupt", [_corrupt_truncate, _corrupt_flip])
def test_only_step_corrupted_gives_none(tmp_path, corrupt):
    save_steps(tmp_path, [1])
    corrupt(biggest_data_file(tmp_path, "proposer", 1))
    with pytest.warns(RuntimeWarning, match="step 1"):
        assert restore(tmp_path) is None


def test_complete_steps_that_do_not_fit_this_run_are_an_error_not_a_fresh_start(tmp_path):
    # E.g. an optimiser state of another layout: starting afresh would only fail at the first save.
    save_steps(tmp_path, [1, 2])
    wider = {p: abstract({**policy_state(0), "params": {"embed": jnp.zeros((16, 9))}}) for p in POLICIES}
    with (
        RunCheckpointer(tmp_path, POLICIES) as ckpt,
        pytest.warns(RuntimeWarning, match="step 2"),
        pytest.raises(RuntimeError, match="do not fit") as err,
    ):
        ckpt.restore(wider)
    assert str(tmp_path) in str(err.value) and "step 2" in str(err.value)
    # another configuration's steps are not this run's to move
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["1", "2"]
    assert not (tmp_path / "set_aside").exists()


def test_orbax_read_error_with_matching_manifest_falls_back(tmp_path):
    # Storage that lies: the manifest matches the truncated file, so only orbax's own read can fail.
    from marljax.train.checkpoint import write_manifest

    save_steps(tmp_path, [1, 2])
    _corrupt_truncate(biggest_data_file(tmp_path, "proposer", 2))
    write_manifest(str(tmp_path / "checkpoints" / "2"), 2)
    with pytest.warns(RuntimeWarning, match="step 2"):
        assert restore(tmp_path)[0] == 1


def test_complete_steps_that_do_not_restore_are_set_aside_and_saved_again(tmp_path):
    """Old code fell back to step 1 and then refused to save step 2 (FileExistsError), on every
    rerun, until someone deleted the step by hand."""
    from marljax.train.checkpoint import write_manifest

    save_steps(tmp_path, [1, 2, 3])
    for s in (2, 3):  # the manifests vouch for the damage: only orbax's read can tell
        _corrupt_truncate(biggest_data_file(tmp_path, "proposer", s))
        write_manifest(str(tmp_path / "checkpoints" / str(s)), s)
    with RunCheckpointer(tmp_path, POLICIES) as ckpt:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            step, _, loop = ckpt.restore({p: abstract(policy_state(0)) for p in POLICIES})
        assert step == 1 and loop == loop_state(1)
        assert sorted(os.listdir(tmp_path / "checkpoints")) == ["1"]
        kept = sorted((tmp_path / "set_aside").iterdir())
        assert [p.name.split(".")[0] for p in kept] == ["checkpoint-2", "checkpoint-3"]
        for s, path in zip((2, 3), kept):
            assert (path / MANIFEST).is_file()  # moved whole
            said = [str(w.message) for w in caught if str(path) in str(w.message)]
            assert len(said) == 1 and f"step {s} passes its manifest but does not restore (" in said[0]
        ckpt.save(2, {p: policy_state(i) for i, p in enumerate(POLICIES)}, loop_state(22))
    assert restore(tmp_path)[2] == loop_state(22)


@pytest.mark.parametrize("damage", ["policy_dir", "loop_dir", "manifest"])
def test_step_incomplete_in_one_manager_is_skipped(tmp_path, damage):
    save_steps(tmp_path, [1, 2, 3])
    if damage == "policy_dir":
        shutil.rmtree(step_dir(tmp_path, "proposer", 3))
    elif damage == "loop_dir":
        shutil.rmtree(step_dir(tmp_path, "loop", 3))
    else:  # killed between orbax's commit and the manifest
        os.remove(tmp_path / "checkpoints" / "3" / MANIFEST)
    with RunCheckpointer(tmp_path, POLICIES) as ckpt:
        assert ckpt.latest_step() == 2
        with pytest.warns(RuntimeWarning, match="step 3"):
            step, got, loop = ckpt.restore({p: abstract(policy_state(0)) for p in POLICIES})
        assert step == 2 and loop == loop_state(2)
        assert_same_tree(got["proposer"], policy_state(20))
        # Resuming rewrites step 3 over the leftovers; a complete step is never overwritten.
        ckpt.save(3, {p: policy_state(i) for i, p in enumerate(POLICIES)}, loop_state(33))
        ckpt.wait()
        assert ckpt.latest_step() == 3
    with RunCheckpointer(tmp_path, POLICIES) as ckpt, pytest.raises(FileExistsError, match="step 3"):
        ckpt.save(3, {p: policy_state(i) for i, p in enumerate(POLICIES)}, loop_state(3))
    assert restore(tmp_path)[2] == loop_state(33)


def test_restore_onto_shardings(tmp_path):
    dev = jax.devices()[0]
    single = jax.sharding.SingleDeviceSharding(dev)
    mesh = jax.sharding.Mesh(np.array([dev]), ("data",))
    named = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data", None))
    states = {p: policy_state(i) for i, p in enumerate(POLICIES)}
    with RunCheckpointer(tmp_path, POLICIES) as ckpt:
        ckpt.save(1, states, {"x": 1})
    target = {
        p: jax.tree.map(
            lambda x: (
                jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=single) if isinstance(x, jax.Array) else x
            ),
            s,
        )
        for p, s in states.items()
    }
    target["reviser"]["params"]["embed"] = jax.ShapeDtypeStruct((16, 8), jnp.float32, sharding=named)
    with RunCheckpointer(tmp_path, POLICIES) as ckpt:
        _, got, _ = ckpt.restore(target)
    for p in POLICIES:
        assert_same_tree(got[p], states[p])
    leaves = [x for x in jax.tree.leaves(got["proposer"]) if isinstance(x, jax.Array)]
    assert leaves and all(x.sharding == single for x in leaves)
    embed = got["reviser"]["params"]["embed"]
    assert isinstance(embed.sharding, jax.sharding.NamedSharding) and embed.sharding.spec == named.spec
    assert embed.sharding.mesh.axis_names == ("data",)


# ---------------------------------------------------------------- SIGKILL


class Writer:
    """The writer subprocess, its stdout lines collected by a thread (so waits can time out)."""

    def __init__(self, run_dir: Path, last: int, log: Path):
        env = dict(
            os.environ,
            JAX_PLATFORMS="cpu",
            PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        )
        self.log = open(log, "a")
        self.proc = subprocess.Popen(
            [sys.executable, str(WRITER_PATH), str(run_dir), str(last)],
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=env,
        )
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def wait_for(self, line: str, timeout: float = 60.0):
        while True:
            got = self.lines.get(timeout=timeout)
            assert got is not None, f"writer exited before {line!r}: {self.seen}"
            self.seen.append(got)
            if got == line:
                return

    def kill(self):
        os.kill(self.proc.pid, signal.SIGKILL)
        self.finish()

    def finish(self):
        self.proc.wait(timeout=60)
        self.reader.join(timeout=60)
        while (got := self.lines.get(timeout=5)) is not None:
            self.seen.append(got)
        self.log.close()

    def last(self, word: str) -> int:
        return max((int(s.split()[1]) for s in self.seen if s.startswith(word + " ")), default=0)


def check_restorable(run_dir: Path, at_least: int) -> int:
    with RunCheckpointer(run_dir, writer.POLICIES) as ckpt, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = ckpt.restore(writer.abstract_states())
    assert all("step" in str(w.message) for w in caught)  # only fallback reports
    if at_least == 0 and got is None:
        return 0
    assert got is not None, "nothing restorable"
    step, states, loop = got
    assert step >= at_least
    for p in writer.POLICIES:
        want = writer.policy_state(p, step)
        assert np.asarray(states[p]["params"]["w"]).tobytes() == want["params"]["w"].tobytes()
        assert np.asarray(states[p]["params"]["b"]).tobytes() == want["params"]["b"].tobytes()
        assert int(states[p]["step"]) == step
    assert loop == writer.loop_state(step)
    return step


@pytest.mark.slow
def test_sigkill_at_any_moment_leaves_a_restorable_step(tmp_path):
    rng = random.Random(0)
    run_dir, log = tmp_path / "run", tmp_path / "writer.log"
    done = 0  # newest step the writer reported fully written, across restarts
    # (line "word start+offset" to wait for, extra delay before SIGKILL); each run resumes after the
    # last restorable step, so leftovers of the previous kill are in the way of its first save.
    kills = [
        ("saved", 1, 0.0),
        ("done", 1, 0.0),
        ("saved", 2, rng.uniform(0.0, 0.05)),
        ("saved", 1, rng.uniform(0.0, 0.3)),
        ("start", 0, rng.uniform(0.0, 0.2)),
        (None, 0, rng.uniform(1.0, 3.0)),
    ]
    writers: list[Writer] = []
    try:
        for word, offset, delay in kills:
            before = done
            w = Writer(run_dir, 1000, log)
            writers.append(w)
            if word is not None:
                w.wait_for(f"start {done + 1}")
                if word != "start":
                    w.wait_for(f"{word} {done + 1 + offset}")
            threading.Event().wait(delay)  # (None: somewhere in start-up, restore or the first saves)
            w.kill()
            done = max(done, w.last("done"))
            restored = check_restorable(run_dir, done)
            assert restored <= max(before, w.last("saved") + 1), (restored, w.seen)
            done = restored  # the next writer resumes from here
        # A final uninterrupted run resumes, finishes, and leaves exactly `keep` steps and no tmp dirs.
        w = Writer(run_dir, done + 3, log)
        writers.append(w)
        w.finish()
        assert w.proc.returncode == 0 and w.last("done") == done + 3, w.seen
    finally:  # never leave a writer running when an assertion fails
        for w in writers:
            if w.proc.poll() is None:
                w.proc.kill()
    assert check_restorable(run_dir, done + 3) == done + 3
    assert sorted(os.listdir(run_dir / "checkpoints"), key=int) == [str(done + 2), str(done + 3)]


@pytest.mark.parametrize("corrupt", [None, _corrupt_flip])
def test_trainer_restore_frees_the_initial_state_first_and_rebuilds_it_when_no_step_restores(
    tmp_path, corrupt
):
    """A resume reads the checkpoint after dropping the freshly loaded weights (one state in memory,
    not two); if the only step turns out corrupt (its sizes match, its hashes do not), the policies
    are built again and the run starts afresh from the initial weights."""
    from marljax.train.config import load_config
    from marljax.train.loop import Trainer

    overrides = [f"run_dir={tmp_path / 'run'}", "train.log_to=[]", "train.progress=false"]
    cfg = load_config(ROOT / "configs" / "grpo_tiny.yaml", overrides)
    first = Trainer(cfg)
    initial = jax.tree.map(np.asarray, first.policies["main"].params)
    main = first.policies["main"]
    main.state = main.state.replace(version=7)  # marks the saved state apart from a rebuilt one
    first.save()
    first.close()
    if corrupt is not None:
        corrupt(biggest_data_file(tmp_path / "run", "main", 0))
    second = Trainer(cfg)
    if corrupt is None:
        assert second.restore() and second.policies["main"].version == 7
    else:
        with pytest.warns(RuntimeWarning, match="step 0"):
            assert not second.restore()
        assert second.policies["main"].version == 0 and second.policies["main"].state.opt_state is not None
    # the generators sample with the policies the trainer now holds, not the released ones
    assert second.generator.policies["main"] is second.policies["main"]
    assert second.eval_generator.policies["main"] is second.policies["main"]
    assert jax.tree.structure(second.policies["main"].params) == jax.tree.structure(initial)
    for got, want in zip(jax.tree.leaves(second.policies["main"].params), jax.tree.leaves(initial)):
        np.testing.assert_array_equal(np.asarray(got), want)
    second.close()


def test_a_run_directory_of_the_older_per_policy_layout_is_an_error(tmp_path):
    (tmp_path / "checkpoints" / POLICIES[0] / "10").mkdir(parents=True)
    with pytest.raises(FileExistsError, match="older per-policy layout"):
        RunCheckpointer(tmp_path, POLICIES)
