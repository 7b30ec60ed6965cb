"""The off-policy states a checkpoint restores are untrusted input too: a replay buffer's
index and fill flag, the algorithms' counters and the optimizers' step counts are refused, in
one line naming the field and its value, where no run writes them, though the checkpoint was
re-saved through `CheckpointStore.save` (so its checksum is valid). And an intact DQN or SAC
checkpoint reads back without a target (`restore_raw`), checksum verified."""

import hashlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import serialization

from genesis_jax.algos.dqn import DQNConfig
from genesis_jax.algos.dqn.train import DQN
from genesis_jax.algos.sac import SACConfig
from genesis_jax.algos.sac.train import SAC
from genesis_jax.cli import EXIT_BAD_INPUT, main
from genesis_jax.run.checkpoint import CheckpointMismatchError, CheckpointStore, state_digest
from tests.algos.test_dqn import TINY as DQN_TEST_TINY
from tests.support.files import snapshot

# tests/algos/test_dqn.py's and test_sac.py's TINY, smaller still: 300 transitions a buffer.
DQN_TINY = {**DQN_TEST_TINY, "total_steps": 400, "learning_starts": 100, "buffer_size": 300, "epsilon_fraction": 1.0}
SAC_TINY = dict(num_envs=8, steps_per_row=8, batch_size=8, learning_starts=8, hidden=(16, 16), buffer_size=256)
DQN_PATH, SAC_PATH = ("train_state",), ("critic",)


# The module's fixtures build DQN and SAC once (a compiled init each): 4 s on 2 idle cores, 12 s on busy ones.
@pytest.fixture(scope="module")
def dqn():
    return DQN(DQNConfig(**DQN_TINY))


@pytest.fixture(scope="module")
def dqn_state(dqn):
    """A DQN state whose buffer holds 5 transitions (slots 0 to 4) of ones."""
    state = jax.jit(dqn.init)(jax.random.PRNGKey(0))  # compiled once: faster than Flax's eager init
    ones = jax.tree.map(lambda leaf: jnp.ones((5, *leaf.shape), leaf.dtype), dqn.replay.added)
    return state.replace(buffer=dqn.replay.add(state.buffer, ones), steps=jnp.int32(5))


@pytest.fixture(scope="module")
def sac_state():
    return jax.jit(SAC(SACConfig(**SAC_TINY)).init)(jax.random.PRNGKey(0))


def save(directory, step, state, train_state_path, kind):
    """The project's own save path, as a run's `Session` takes it: the checksum matches `state`."""
    with CheckpointStore(directory, async_save=False) as store:
        store.save(step, state, {"kind": kind, "step": step}, force=True, train_state_path=train_state_path)


def restore(directory, target, train_state_path, kind):
    with CheckpointStore(directory, async_save=False) as store:
        return store.restore(target, kind=kind, train_state_path=train_state_path)[0]


def replace_leaf(state, field: str, value):
    """`state` with the leaf whose path ends in `field` ("buffer.current_index") set to `value`."""

    def change(path, leaf):
        named = ".".join(str(getattr(k, "name", getattr(k, "key", getattr(k, "idx", k)))) for k in path)
        return jnp.asarray(value, leaf.dtype) if named.endswith(field) else leaf

    return jax.tree_util.tree_map_with_path(change, state)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["dqn", "sac"])
def test_an_intact_off_policy_checkpoint_reads_back_without_a_target(tmp_path, kind, dqn_state, sac_state):
    """flashbax's buffer state is a dataclass; read back without a target it is a dict."""
    state, path = (dqn_state, DQN_PATH) if kind == "dqn" else (sac_state, SAC_PATH)
    save(tmp_path / "c", 3, state, path, kind)
    with CheckpointStore(tmp_path / "c", async_save=False) as store:
        raw, meta = store.restore_raw(3)
    assert meta["kind"] == kind
    np.testing.assert_array_equal(raw["buffer"]["current_index"], state.buffer.current_index)


def _digest_before_canonical_paths(state_dict) -> str:
    """The checksum genesis-jax wrote before its paths were spelled alike in dicts and dataclasses."""
    digest = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(state_dict)[0]:
        arr = np.ascontiguousarray(np.asarray(leaf))
        digest.update(f"{jax.tree_util.keystr(path)}|{arr.dtype.name}|{arr.shape}|".encode())
        digest.update(arr.tobytes())
    return digest.hexdigest()


def save_as_before(directory, step, state, train_state_path, kind):
    """`save`, with the checksum genesis-jax wrote before its paths were spelled alike (at
    6eb73ed): its meta is otherwise the same (the leaf spec was spelled so then too)."""
    save(directory, step, state, train_state_path, kind)
    with CheckpointStore(directory, async_save=False) as store:
        meta = store.read_meta(step)
    state_dict = jax.tree.map(np.asarray, serialization.to_state_dict(state))
    meta["digest"] = _digest_before_canonical_paths(state_dict)
    shutil.rmtree(directory / str(step))
    manager = ocp.CheckpointManager(directory, item_names=("state", "meta"))
    manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state_dict), meta=ocp.args.JsonSave(meta)))
    manager.close()


def test_a_dqn_checkpoint_written_with_the_earlier_checksum_still_restores_and_saves_again(tmp_path, dqn_state):
    save_as_before(tmp_path / "c", 3, dqn_state, DQN_PATH, "dqn")
    restored = restore(tmp_path / "c", dqn_state, DQN_PATH, "dqn")
    assert int(restored.buffer.current_index) == 5
    with CheckpointStore(tmp_path / "c", async_save=False) as store:  # the same state at its step: a no-op
        assert store.save(3, dqn_state, {"kind": "dqn", "step": 3}, force=True, train_state_path=DQN_PATH) is False


@pytest.mark.parametrize("kind", ["dqn", "sac"])
def test_an_off_policy_checkpoint_written_with_the_earlier_checksum_reads_back_without_a_target(
    tmp_path, kind, dqn_state, sac_state
):
    """Read without a target, flashbax's dataclass is a dict: the earlier checksum spelled its
    fields as attributes (SAC's transitions too, a namedtuple), in their own order."""
    state, path = (dqn_state, DQN_PATH) if kind == "dqn" else (sac_state, SAC_PATH)
    save_as_before(tmp_path / "c", 3, state, path, kind)
    with CheckpointStore(tmp_path / "c", async_save=False) as store:
        raw, meta = store.restore_raw(3)
    assert meta["kind"] == kind
    np.testing.assert_array_equal(raw["buffer"]["current_index"], state.buffer.current_index)
    np.testing.assert_array_equal(raw["buffer"]["is_full"], state.buffer.is_full)


DQN_TAMPERED = {
    "index past the capacity": ("buffer.current_index", 99999, "buffer.current_index = 99999,"),
    "index negative": ("buffer.current_index", -1, "buffer.current_index = -1,"),
    "not full, transitions past the index": ("buffer.current_index", 2, "buffer.is_full = False,"),
    "steps negative": ("steps", -5, "holds steps = -5,"),
    # 5 transitions added (steps) to a buffer of 300: it never wrapped, and slot 5 is the next.
    "full, never wrapped": (
        "buffer.is_full",
        True,
        "buffer.is_full = True, which must be False (steps = 5: 5 transitions",
    ),
    "index not the transitions added": (
        "buffer.current_index",
        7,
        "buffer.current_index = 7, which must be 5 (steps = 5:",
    ),
    "optimizer step negative": ("train_state.step", -1, "holds train_state.step = -1,"),
    "adam count negative": ("opt_state.inner_state.0.count", -3, "train_state.opt_state.inner_state.0.count = -3,"),
}


@pytest.mark.parametrize("case", list(DQN_TAMPERED))
def test_a_dqn_checkpoint_saved_with_values_no_run_writes_is_refused_in_one_line(tmp_path, dqn_state, case):
    field, value, words = DQN_TAMPERED[case]
    save(tmp_path / "c", 3, replace_leaf(dqn_state, field, value), DQN_PATH, "dqn")
    before = snapshot(tmp_path / "c")
    with pytest.raises(CheckpointMismatchError) as err:
        restore(tmp_path / "c", dqn_state, DQN_PATH, "dqn")
    message = str(err.value)
    assert "\n" not in message and words in message and f"checkpoint at step 3 in {tmp_path / 'c'}" in message, message
    assert snapshot(tmp_path / "c") == before


def test_a_sac_checkpoint_with_a_negative_iteration_or_an_impossible_buffer_is_refused(tmp_path, sac_state):
    for field, value in (("iteration", -2), ("buffer.current_index", 256), ("buffer.is_full", True)):
        save(tmp_path / field, 3, replace_leaf(sac_state, field, value), SAC_PATH, "sac")
        with pytest.raises(CheckpointMismatchError, match=rf"holds {field} = {value}, which must be"):
            restore(tmp_path / field, sac_state, SAC_PATH, "sac")


def test_the_seed_of_a_bad_buffer_index_is_named(tmp_path, dqn_state):
    seeds = jax.tree.map(lambda x: jnp.stack([x, x]), dqn_state)
    tampered = seeds.replace(buffer=seeds.buffer.replace(current_index=jnp.array([5, 300], jnp.int32)))
    save(tmp_path / "c", 3, tampered, DQN_PATH, "dqn")
    with pytest.raises(
        CheckpointMismatchError, match=r"buffer\.current_index = 300 \(seed 1\), which must be from 0 to"
    ):
        restore(tmp_path / "c", seeds, DQN_PATH, "dqn")


def test_the_seed_of_a_buffer_full_before_its_transitions_fill_it_is_named(tmp_path, dqn_state):
    seeds = jax.tree.map(lambda x: jnp.stack([x, x]), dqn_state)  # 5 transitions each
    tampered = seeds.replace(buffer=seeds.buffer.replace(is_full=jnp.array([False, True])))
    save(tmp_path / "c", 3, tampered, DQN_PATH, "dqn")
    with pytest.raises(CheckpointMismatchError) as err:
        restore(tmp_path / "c", seeds, DQN_PATH, "dqn")
    words = "holds buffer.is_full = True (seed 1), which must be False (steps = 5: 5 transitions added to 300 slots"
    assert words in str(err.value), err.value


def test_every_buffer_a_run_can_write_restores(tmp_path, dqn_state):
    """The controls: empty, partly filled, and full with the index anywhere (it wrapped)."""
    empty = dqn_state.replace(buffer=dqn_state.buffer.replace(current_index=jnp.int32(0)), steps=jnp.int32(0))
    empty = empty.replace(buffer=jax.tree.map(jnp.zeros_like, empty.buffer))
    wrapped = dqn_state.replace(buffer=dqn_state.buffer.replace(current_index=jnp.int32(2), is_full=jnp.bool_(True)))
    wrapped = wrapped.replace(steps=jnp.int32(DQN_TINY["buffer_size"] + 2))  # its transitions: once round, and 2
    for name, state in {"empty": empty, "partly filled": dqn_state, "wrapped": wrapped}.items():
        save(tmp_path / name, 3, state, DQN_PATH, "dqn")
        restored = restore(tmp_path / name, dqn_state, DQN_PATH, "dqn")
        assert int(restored.buffer.current_index) == int(state.buffer.current_index), name


DQN_CLI = ["train", "dqn", "--no-progress", "--hidden", "16"]
DQN_CLI += [f"--{k.replace('_', '-')}={v}" for k, v in DQN_TINY.items() if k not in ("hidden", "total_steps")]


@pytest.mark.slow  # a tiny DQN run through the command line (compiled on the CPU), then a refused resume: ~25 s
def test_the_command_line_refuses_a_dqn_checkpoint_with_its_buffer_index_past_the_capacity(tmp_path, capsys):
    out = tmp_path / "dqn"
    assert main([*DQN_CLI, "--total-steps=400", "--out", str(out)]) == 0
    checkpoints, algo = out / "checkpoints", DQN(DQNConfig(**DQN_TINY))
    with CheckpointStore(checkpoints, async_save=False) as store:
        step = store.latest_step()
        state, meta = store.restore(algo.initial_state(), step, "dqn", DQN_PATH)
    shutil.rmtree(checkpoints / str(step))
    with CheckpointStore(checkpoints, async_save=False) as store:  # the project's own save: a valid checksum
        store.save(
            step, replace_leaf(state, "buffer.current_index", 99999), meta, force=True, train_state_path=DQN_PATH
        )
    before = snapshot(out)
    capsys.readouterr()
    assert main([*DQN_CLI, "--total-steps=600", "--out", str(out), "--resume"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("genesis-jax: error: "), err
    assert "buffer.current_index = 99999, which must be from 0 to 299" in err[0], err
    assert snapshot(out) == before


def test_the_checksum_of_a_state_of_dicts_is_spelled_as_before(dqn_state):
    """PPO's and the world model's states hold dicts alone: their checkpoints' checksums still match."""
    state_dict = serialization.to_state_dict(dqn_state.train_state)
    assert state_digest(state_dict) == _digest_before_canonical_paths(state_dict)
