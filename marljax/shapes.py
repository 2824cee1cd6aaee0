"""Padded sizes: arrays are padded up to a few bucket sizes so that jitted code compiles rarely."""

from __future__ import annotations


def round_up(n: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= n (at least `multiple`)."""
    return max(multiple, -(-n // multiple) * multiple)


def power_of_two_bucket(n: int, minimum: int = 1) -> int:
    """The smallest power of two >= max(n, minimum): sizes up to N need log2(N) shapes, and at
    most half of a bucket is padding."""
    return 1 << max(0, (max(n, minimum) - 1).bit_length())


def geometric_bucket(n: int, unit: int = 1) -> int:
    """The smallest `unit * b >= n` with `b` in 1, 2, 3, 4, 6, 8, 12, 16, ... (powers of two and
    1.5 times them): at most a third is padding, and sizes up to `N` need O(log N) shapes."""
    b = 1
    while unit * b < n:
        if b == 1:
            b = 2
        elif b & (b - 1) == 0:  # a power of two: next is 1.5 times it
            b = b * 3 // 2
        else:  # 1.5 times a power of two: next is the following power of two
            b = b * 4 // 3
    return unit * b
