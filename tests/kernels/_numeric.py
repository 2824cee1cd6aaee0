"""Independent numeric references shared by the kernel tests."""

import numpy as np


def np_fd_grad(f, x, eps=1e-6):
    """Central finite-difference gradient of scalar `f` at `x`, in float64."""
    x = np.array(x, np.float64)
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[idx] += eps
        xm[idx] -= eps
        g[idx] = (f(xp) - f(xm)) / (2 * eps)
    return g
