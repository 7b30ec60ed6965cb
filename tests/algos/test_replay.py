"""The replay layer over flashbax: compact storage, exact round trips, sampling only what was
added, the buffer's bytes measured on its state, and the size checks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from genesis_jax.data.replay import buffer_bytes, check_replay_sizes, grow, make_replay
from tests.support.helpers import tree_equal


def minatar_transition(frame_dtype):
    frame = jnp.zeros((10, 10, 4), frame_dtype)
    return {
        "obs": frame,
        "next_obs": frame,
        "action": jnp.int32(0),
        "reward": jnp.float32(0),
        "done": jnp.bool_(False),
    }


def random_batch(key, n):
    k1, k2, k3, k4 = jax.random.split(key, 4)
    return {
        "frame": jax.random.bernoulli(k1, 0.3, (n, 10, 10, 4)),
        "pixels": jax.random.randint(k2, (n, 8, 8), 0, 256).astype(jnp.uint8),
        "vector": jax.random.normal(k3, (n, 4), jnp.float32) * 1e3,
        "action": jax.random.randint(k4, (n,), 0, 6),
    }


def test_stored_dtypes_are_compact():
    example = jax.tree.map(lambda x: x[0], random_batch(jax.random.PRNGKey(0), 1))
    state = jax.eval_shape(make_replay(example, 64, 8).init)
    stored = {k: v.dtype for k, v in state.experience.items()}
    assert stored == {"frame": jnp.uint8, "pixels": jnp.uint8, "vector": jnp.float32, "action": jnp.int32}
    half = jax.eval_shape(make_replay(example, 64, 8, storage_dtype=jnp.bfloat16).init)
    assert half.experience["vector"].dtype == jnp.bfloat16
    assert half.experience["frame"].dtype == jnp.uint8


@pytest.mark.slow  # compiles several buffers: about 12 s on 2 cores
def test_round_trip_is_exact_in_the_added_dtypes():
    """With sample_dtype=None, each sampled row equals the added row bit for bit, bools and
    uint8 frames and float32 vectors alike; with the default, bools and floats come back float32."""
    n = 16
    batch = random_batch(jax.random.PRNGKey(1), n)
    batch["id"] = jnp.arange(n)
    example = jax.tree.map(lambda x: x[0], batch)
    exact = make_replay(example, capacity=n, batch_size=n, sample_dtype=None)
    state = exact.add(exact.init(), batch)
    sample = jax.jit(exact.sample)(state, jax.random.PRNGKey(2))
    for name in ("frame", "pixels", "vector", "action"):
        assert sample[name].dtype == batch[name].dtype, name
        np.testing.assert_array_equal(np.asarray(sample[name]), np.asarray(batch[name])[np.asarray(sample["id"])])
    as_float = make_replay(example, capacity=n, batch_size=n)
    sample = as_float.sample(as_float.add(as_float.init(), batch), jax.random.PRNGKey(2))
    assert sample["frame"].dtype == jnp.float32 and sample["pixels"].dtype == jnp.uint8
    np.testing.assert_array_equal(
        np.asarray(sample["frame"]), np.asarray(batch["frame"])[np.asarray(sample["id"])].astype(np.float32)
    )


@pytest.mark.slow
def test_samples_only_filled_slots_and_the_newest_after_wrapping():
    replay = make_replay({"id": jnp.int32(0)}, capacity=50, batch_size=10)
    state = replay.add(replay.init(), {"id": jnp.arange(7)})
    assert int(replay.size(state)) == 7 and not bool(replay.can_sample(state))
    drawn = np.concatenate(
        [np.asarray(replay.sample(state, k)["id"]) for k in jax.random.split(jax.random.PRNGKey(0), 50)]
    )
    assert set(drawn) == set(range(7))  # every filled slot, and nothing else
    add = jax.jit(replay.add)
    for start in range(7, 127, 10):  # 127 transitions in all through 50 slots
        state = add(state, {"id": jnp.arange(start, start + 10)})
    assert int(replay.size(state)) == 50 and bool(replay.can_sample(state))
    drawn = np.concatenate(
        [np.asarray(replay.sample(state, k)["id"]) for k in jax.random.split(jax.random.PRNGKey(1), 100)]
    )
    assert set(drawn) == set(range(77, 127))  # the newest 50


def test_a_grown_buffer_keeps_its_transitions_in_order_and_samples_as_before():
    """Never wrapped: the buffer a run of the larger capacity would hold, so it samples the same;
    wrapped: unrolled oldest first, so it samples what it sampled (flashbax counts from the oldest)."""
    small, large = make_replay({"id": jnp.int32(0)}, 8, 4), make_replay({"id": jnp.int32(0)}, 32, 4)
    ids = lambda start, n: {"id": jnp.arange(start, start + n)}  # noqa: E731
    key = jax.random.PRNGKey(0)
    filled = small.add(small.init(), ids(0, 8))  # full, nothing overwritten
    tree_equal(grow(filled, 32), large.add(large.init(), ids(0, 8)))
    np.testing.assert_array_equal(
        large.sample(grow(filled, 32), key)["id"], large.sample(large.add(large.init(), ids(0, 8)), key)["id"]
    )
    wrapped = small.add(filled, ids(8, 5))  # 13 through 8 slots: holds 5 to 12, the oldest at slot 5
    grown = grow(wrapped, 32)
    np.testing.assert_array_equal(grown.experience["id"][0], np.r_[5:13, np.zeros(24, int)])
    assert (int(grown.current_index), bool(grown.is_full)) == (8, False)
    np.testing.assert_array_equal(large.sample(grown, key)["id"], small.sample(wrapped, key)["id"])
    with pytest.raises(ValueError, match="holds 8 transitions; it grows, it does not shrink to 4"):
        grow(wrapped, 4)


def test_minatar_buffer_in_uint8_is_at_most_026_of_float32():
    """1e6 MinAtar transitions (obs and next obs 10x10x4, action, reward, done), measured on
    the buffer state's shapes (eval_shape: nothing allocated)."""
    capacity = 1_000_000
    compact = buffer_bytes(jax.eval_shape(make_replay(minatar_transition(jnp.bool_), capacity, 128).init))
    float32 = buffer_bytes(jax.eval_shape(make_replay(minatar_transition(jnp.float32), capacity, 128).init))
    assert float32 == capacity * (2 * 400 * 4 + 4 + 4 + 1) + 5  # the reference: counted by hand
    assert compact == capacity * (2 * 400 + 4 + 4 + 1) + 5
    assert compact / float32 <= 0.26


def test_buffer_bytes_of_a_real_state_equal_its_nbytes():
    replay = make_replay(minatar_transition(jnp.bool_), 100, 8)
    state = replay.init()
    assert buffer_bytes(state) == sum(x.nbytes for x in jax.tree.leaves(state))
    assert buffer_bytes(state) == buffer_bytes(jax.eval_shape(replay.init))


def test_size_checks_name_both_numbers():
    with pytest.raises(ValueError, match="buffer-size 100 is smaller than batch-size 128"):
        make_replay({"x": jnp.float32(0)}, capacity=100, batch_size=128)
    with pytest.raises(
        ValueError, match=r"needs 4\.00 GiB \(4294967296 bytes\) but only 1\.00 GiB \(1073741824 bytes\)"
    ):
        check_replay_sizes(10_000, 128, nbytes=2**32, available=2**30)
    check_replay_sizes(10_000, 128, nbytes=2**30, available=2**32)  # fits: no error
