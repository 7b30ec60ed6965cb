"""Replay buffers: a thin layer over flashbax's item buffer that stores transitions compactly.

What is stored, per leaf of the example transition:

- bool and uint8 leaves (MinAtar's 0/1 frames, Atari's pixels, done flags) as uint8;
- floating leaves (continuous observations, float images, rewards) as `storage_dtype`: float32 by default;
  float16 or bfloat16 halves their memory (the compute dtype of a mixed-precision run; the
  values are rounded once, on the way in);
- integer leaves (discrete actions) as int32.

`sample` hands bool and floating leaves back in `sample_dtype` (float32 by default: what a
network and a TD target read; None: each leaf's own dtype, an exact round trip), uint8 leaves
as uint8 (a torso scales pixels itself) and integers as int32. The buffer's state is a pytree
of arrays (flashbax's `TrajectoryBufferState`): it lives inside an algorithm's state, is
checkpointed with it, and `buffer_bytes` measures it, without allocating, via `jax.eval_shape`.

>>> import jax, jax.numpy as jnp
>>> example = {"obs": jnp.zeros((10, 10, 4), bool), "action": jnp.int32(0), "reward": jnp.float32(0)}
>>> replay = make_replay(example, capacity=1000, batch_size=32)
>>> buffer_bytes(jax.eval_shape(replay.init))  # 1000 x (400 uint8 + 4 int32 + 4 float32) + counters
408005
>>> state = replay.init()
>>> batch = jax.tree.map(lambda x: jnp.ones((8, *x.shape), x.dtype), example)  # 8 transitions
>>> state = replay.add(state, batch)
>>> int(replay.size(state)), bool(replay.can_sample(state))
(8, False)
>>> sample = replay.sample(state, jax.random.PRNGKey(0))  # from the 8 filled slots only
>>> sample["obs"].dtype, sample["obs"].shape, sample["action"].dtype
(dtype('float32'), (32, 10, 10, 4), dtype('int32'))
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flashbax
import jax
import jax.numpy as jnp
import numpy as np
from flashbax.buffers.trajectory_buffer import TrajectoryBufferState

from genesis_jax.amp.restore import register_restore_check
from genesis_jax.data.trajectories import host_memory_bytes


@dataclasses.dataclass(frozen=True)
class _Leaf:
    shape: tuple
    dtype: Any
    stored: Any
    sampled: Any


def _leaf(x, storage_dtype, sample_dtype):
    """A leaf's shape, its dtype, the dtype it is stored in and the one `sample` returns.

    >>> leaves = [_leaf(jnp.zeros(2, t), jnp.bfloat16, jnp.float32) for t in (bool, jnp.uint8, float, int)]
    >>> [(str(leaf.stored), str(leaf.sampled)) for leaf in leaves]
    [('uint8', 'float32'), ('uint8', 'uint8'), ('bfloat16', 'float32'), ('int32', 'int32')]
    """
    dtype = jnp.dtype(jnp.asarray(x).dtype)
    floating = jnp.issubdtype(dtype, jnp.floating)
    if not (dtype == jnp.bool_ or floating or jnp.issubdtype(dtype, jnp.integer)):
        raise ValueError(f"a replay buffer stores bool, integer and float leaves, not {dtype}")
    stored = jnp.dtype(jnp.uint8 if dtype in (jnp.bool_, jnp.uint8) else storage_dtype if floating else jnp.int32)
    sampled = dtype if sample_dtype is None else jnp.dtype(sample_dtype) if floating or dtype == jnp.bool_ else stored
    return _Leaf(tuple(jnp.shape(x)), dtype, stored, sampled)


def buffer_bytes(state) -> int:
    """Bytes of a buffer state's arrays (or of `jax.eval_shape`'s shapes of one: nothing
    allocated), all seeds' buffers together where the state is stacked over seeds."""
    return sum(x.size * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(state))


@dataclasses.dataclass(frozen=True)
class Replay:
    """A uniform replay buffer of `capacity` transitions, sampling `batch_size` at a time.
    Its functions are pure (jit-able); the state they pass around is a pytree of arrays."""

    buffer: Any  # flashbax's item buffer
    added: Any  # per leaf of the example: its shape, dtype, stored and sampled dtypes (`_Leaf`)
    capacity: int
    batch_size: int

    def init(self):
        """An empty buffer state."""
        return self.buffer.init(jax.tree.map(lambda s: jnp.zeros(s.shape, s.stored), self.added))

    def add(self, state, batch):
        """`batch`: transitions with a leading batch axis, in the example's structure."""
        return self.buffer.add(state, jax.tree.map(lambda x, s: x.astype(s.stored), batch, self.added))

    def sample(self, state, key):
        """`batch_size` transitions drawn uniformly from the filled slots."""
        return jax.tree.map(lambda x, s: x.astype(s.sampled), self.buffer.sample(state, key).experience, self.added)

    def can_sample(self, state):
        """True once the buffer holds at least `batch_size` transitions."""
        return self.buffer.can_sample(state)

    def size(self, state):
        """Transitions held (int32)."""
        return jnp.where(state.is_full, self.capacity, state.current_index).astype(jnp.int32)


def make_replay(example, capacity: int, batch_size: int, *, storage_dtype=jnp.float32, sample_dtype=jnp.float32):
    """A `Replay` for transitions shaped like `example` (one transition, no batch axis);
    `storage_dtype` is what floating leaves are stored in, `sample_dtype` what `sample`
    returns them (and bool leaves) in. Checks the sizes first (`check_replay_sizes`)."""
    check_replay_sizes(capacity, batch_size)
    added = jax.tree.map(lambda x: _leaf(x, storage_dtype, sample_dtype), example)
    buffer = flashbax.make_item_buffer(capacity, batch_size, batch_size, add_batches=True)  # max, min, sample sizes
    return Replay(buffer, added, capacity, batch_size)


def capacity_of(state) -> int:
    """The slots of a buffer state (a seed axis before them too): experience is [seeds..., 1, capacity, ...]."""
    return jnp.shape(jax.tree.leaves(state.experience)[0])[jnp.ndim(state.current_index) + 1]


def _buffer_rules(state: TrajectoryBufferState, read) -> list:
    """What a run writes into a buffer state (its restore check, `amp.restore`): the slot the
    next transition goes to lies in the buffer, and a buffer not yet full holds nothing at or
    past that slot (flashbax fills the slots in order, from zeros: data there means it has
    wrapped, so `is_full` was cleared or the index moved back). A full buffer's index may be
    anywhere. Each leaf is read once (its bytes: -0.0 and bfloat16 count too); a full buffer,
    the usual one, is not read at all."""
    index, full, capacity = read(state.current_index), read(state.is_full), capacity_of(state)
    start, written = np.clip(index, 0, capacity), np.zeros(np.shape(index), bool)
    for leaf in jax.tree.leaves(state.experience) if not np.all(full) else []:
        values = read(leaf)
        for seed in np.ndindex(np.shape(index)):
            slots = np.ascontiguousarray(values[seed][:, start[seed] :])
            written[seed] |= not full[seed] and bool(np.any(slots.view(np.uint8)))
    in_order = "True where slots at or past current_index hold transitions (flashbax fills them in order)"
    return [
        ("current_index", index, (index >= 0) & (index < capacity), f"from 0 to {capacity - 1} (the buffer's slots)"),
        ("is_full", full, full | ~written, in_order),
    ]


register_restore_check(TrajectoryBufferState, _buffer_rules)


def empty_like(state, capacity: int):
    """An empty buffer state shaped as `state` (a seed axis included) but of `capacity` slots:
    what a checkpoint of a buffer of that capacity is read into."""
    axis = jnp.ndim(state.current_index) + 1
    zeros = lambda x: jnp.zeros(x.shape[:axis] + (capacity,) + x.shape[axis + 1 :], x.dtype)  # noqa: E731
    counters = dict(current_index=jnp.zeros_like(state.current_index), is_full=jnp.zeros_like(state.is_full))
    return state.replace(experience=jax.tree.map(zeros, state.experience), **counters)


def grow(state, capacity: int):
    """A buffer state in `capacity` slots (at least its own) holding the same transitions in
    the same order. One that never wrapped keeps its slots and index: it is the state a buffer of
    `capacity` given the same transitions holds, and samples as that one does. A wrapped one is
    unrolled, oldest first, into its first slots, its index after them: it samples what it did
    (flashbax counts the slots it samples from the oldest on), not what a larger buffer from the
    start would, which would hold the transitions this one overwrote.

    >>> replay = make_replay({"id": jnp.int32(0)}, capacity=4, batch_size=2)
    >>> state = replay.add(replay.add(replay.init(), {"id": jnp.arange(4)}), {"id": jnp.arange(4, 6)})  # [4 5 2 3]
    >>> grown = grow(state, 8)
    >>> ids = grown.experience["id"]
    >>> ids[0].tolist(), int(grown.current_index), bool(grown.is_full)
    ([2, 3, 4, 5, 0, 0, 0, 0], 4, False)
    """
    old, axis = capacity_of(state), jnp.ndim(state.current_index) + 1
    if capacity < old:
        raise ValueError(f"the replay buffer holds {old} transitions; it grows, it does not shrink to {capacity}")
    if capacity == old:
        return state
    head = jnp.where(state.is_full, state.current_index, 0)  # the oldest transition's slot
    order = (head[..., None] + jnp.arange(old)) % old  # [seeds..., old]: slots oldest first

    def unrolled(x):
        slots = order.reshape(order.shape[:-1] + (1, old) + (1,) * (x.ndim - axis - 1))
        x = jnp.take_along_axis(x, slots, axis=axis)
        return jnp.pad(x, [(0, capacity - old) if i == axis else (0, 0) for i in range(x.ndim)])

    index = jnp.where(state.is_full, old, state.current_index).astype(state.current_index.dtype)
    experience = jax.tree.map(unrolled, state.experience)
    return state.replace(experience=experience, current_index=index, is_full=jnp.zeros_like(state.is_full))


def check_replay_sizes(capacity: int, batch_size: int, nbytes: int | None = None, available: int | None = None):
    """One clear sentence for sizes that cannot work: a buffer smaller than a batch, or one
    larger than the memory available (`nbytes` and `available` in bytes, where known).

    >>> check_replay_sizes(100, 128)
    Traceback (most recent call last):
    ...
    ValueError: buffer-size 100 is smaller than batch-size 128; the buffer must hold at least one batch
    """
    if capacity < batch_size:
        raise ValueError(
            f"buffer-size {capacity} is smaller than batch-size {batch_size}; the buffer must hold at least one batch"
        )
    if nbytes is not None and available is not None and nbytes > available:
        raise ValueError(
            f"the replay buffer needs {nbytes / 2**30:.2f} GiB ({nbytes} bytes) but only "
            f"{available / 2**30:.2f} GiB ({available} bytes) of memory is available; "
            "lower buffer-size (or num-seeds), or store floats in a narrower storage dtype"
        )


def available_memory_bytes() -> int | None:
    """Memory free for a new buffer on the default device: an accelerator's limit less what
    is in use, where it reports them; else the host's available memory (Linux MemAvailable)."""
    stats = getattr(jax.local_devices()[0], "memory_stats", lambda: None)()
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
    return host_memory_bytes()
