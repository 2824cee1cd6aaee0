"""derive_seed keeps every stream's seed equal to the derivation it replaced; the padded sizes."""

import numpy as np
import pytest

from marljax.seeds import derive_seed
from marljax.shapes import geometric_bucket, power_of_two_bucket, round_up

SEEDS = [0, 1, 7, 12345, 2**31 - 1, 2**32 - 1]


@pytest.mark.parametrize("seed", SEEDS)
def test_each_rule_equals_the_derivation_it_replaced(seed):
    for index in (0, 1, 2, 5, 100):
        assert derive_seed(seed, index) == int(np.random.SeedSequence([seed, index]).generate_state(1)[0])
        assert derive_seed(seed, index, "round") == (seed * 1_000_003 + index) % 2**31
        assert derive_seed(seed, index, "policy") == (seed * 1009 + index) % 2**32
        assert derive_seed(seed, index, "stage") == seed + 7919 * index


def test_hashed_seeds_are_32_bit_and_distinct():
    seeds = {derive_seed(s, i) for s in range(20) for i in range(20)}
    assert len(seeds) == 400 and all(0 <= s < 2**32 for s in seeds)
    with pytest.raises(ValueError, match="unknown seed rule"):
        derive_seed(0, 1, "linear")


def test_buckets():
    assert [power_of_two_bucket(n) for n in (0, 1, 2, 3, 5, 16, 17)] == [1, 1, 2, 4, 8, 16, 32]
    assert [power_of_two_bucket(n, minimum=16) for n in (1, 16, 17)] == [16, 16, 32]
    assert [round_up(n, 32) for n in (0, 1, 32, 33)] == [32, 32, 32, 64]
    assert [geometric_bucket(n) for n in (1, 3, 5, 7, 13)] == [1, 3, 6, 8, 16]
