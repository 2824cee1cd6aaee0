"""Writer process for test_checkpoint's SIGKILL test (run with JAX_PLATFORMS=cpu).

`python _checkpoint_writer.py RUN_DIR LAST_STEP`: resumes from the newest
restorable step (or starts at 1), then saves every step up to LAST_STEP.
Prints `start S` before the first save, `saved K` when `save(K)` returns and
`done K` once step K is fully written (`save(K+1)` or `wait()` returned).
Contents are a deterministic function of the step, so the test can recompute them.
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np

POLICIES = ("proposer", "reviser")


def policy_state(name: str, step: int) -> dict:
    rng = np.random.default_rng([step, POLICIES.index(name)])
    return {
        "params": {
            "w": rng.standard_normal((512, 1024), dtype=np.float32),  # 2 MiB
            "b": rng.standard_normal((1024,), dtype=np.float32),
        },
        "step": np.int32(step),
    }


def loop_state(step: int) -> dict:
    rng = np.random.default_rng([step, 99])
    return {
        "step": step,
        "key": rng.integers(0, 2**32, 2).tolist(),
        "buffer": rng.integers(0, 10_000, 100_000).tolist(),
        "note": f"step {step}",
    }


def abstract_states() -> dict:
    return {
        p: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), policy_state(p, 0))
        for p in POLICIES
    }


def main(run_dir: str, last: int) -> None:
    from marljax.train.checkpoint import RunCheckpointer

    ckpt = RunCheckpointer(run_dir, POLICIES, keep=2)
    restored = ckpt.restore(abstract_states())
    start = 1 if restored is None else restored[0] + 1
    print(f"start {start}", flush=True)
    for step in range(start, last + 1):
        states = {p: jax.tree.map(jnp.asarray, policy_state(p, step)) for p in POLICIES}
        ckpt.save(step, states, loop_state(step))
        if step > start:  # save(step) waited for step - 1
            print(f"done {step - 1}", flush=True)
        print(f"saved {step}", flush=True)
    ckpt.close()
    print(f"done {last}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
