"""Orbax checkpoints of a whole training state, loss scaler included.

A checkpoint holds two items: `state` (the pytree as a Flax state dict: params, optimizer
state, scaler with its configuration, counters, PRNG key) and `meta` (JSON: precision,
the run's config, package versions, the scaler's type and a shape/dtype spec of every
leaf). The spec lets a restore name exactly what differs before anything is read.

>>> store = CheckpointStore("runs/x/checkpoints")          # doctest: +SKIP
>>> store.save(100, train_state, {"config": {...}})          # doctest: +SKIP
>>> train_state, meta = store.restore(train_state)           # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import errno
import functools
import gc
import hashlib
import importlib.metadata
import logging
import os
import pathlib
import re
import sys
import traceback
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import serialization

from genesis_jax.amp._checks import is_int
from genesis_jax.amp.loss_scale import NoOpLossScale, any_fixed_scale
from genesis_jax.amp.restore import Rule, key_name, restore_rules
from genesis_jax.amp.state import TrainState
from genesis_jax.run.parallel import host_array

logger = logging.getLogger("genesis_jax")

# Orbax writes each step into "<step>.orbax-checkpoint-tmp..." and renames it when complete.
TMP_MARK = ".orbax-checkpoint-tmp"

# The layout of a checkpoint's state. 2 (genesis-jax 0.2): the skip counts and the guard's
# halted flag live in the optimizer state (amp.skip_nonfinite), the train state holds no PRNG
# key. 3 (0.3): a train state's scaler is its `scaler` field, with a `pending_backoff` flag
# beside it, and a dynamic scaler counts its `backoffs`. Format 2 is read into format 3
# (`as_format_2`, `from_format_2`); format 1 (0.1) is refused with the version that continues it.
CHECKPOINT_FORMAT = 3
READABLE_FORMATS = (2, 3)

_VERSIONED_PACKAGES = ("genesis-jax", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "jmp", "numpy")


class CheckpointMismatchError(ValueError):
    """A checkpoint does not fit the state it is restored into."""


class CheckpointShapeError(CheckpointMismatchError):
    """A checkpoint whose arrays are not the run's (shapes, dtypes, leaves): `differences` names them."""

    def __init__(self, step: int, differences: str):
        super().__init__(f"checkpoint at step {step} does not fit this run: {differences}")
        self.differences = differences


class CountsReplay:
    """Declared (a base class) by an algorithm state that holds a flashbax replay `buffer` and
    counts the transitions it gave it, so a restore can check the buffer against the count."""

    def replay_count(self) -> tuple[str, jax.Array, int]:
        """(the counter's field, its value, transitions added per count): DQN's ("steps", steps, 1)."""
        raise NotImplementedError


def package_versions() -> dict[str, str]:
    versions = {}
    for name in _VERSIONED_PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[name] = importlib.metadata.version(name)
    return versions


def _names(path) -> tuple[str, ...]:
    """A key path's names: an attribute's, a dict key, a sequence index: ("buffer", "current_index")."""
    return tuple(map(key_name, path))


def _flat_spec(state_dict) -> dict[str, str]:
    """'path/to/leaf' -> 'float32[64,4]' for every leaf (an attribute's name after a dot: "buffer/.is_full")."""
    spec = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(state_dict)[0]:
        key = "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
        # as `save` stores it (jnp.asarray): a Python number or a numpy int64 leaf is int32 without x64
        dtype = jax.dtypes.canonicalize_dtype(leaf.dtype if hasattr(leaf, "dtype") else np.asarray(leaf).dtype)
        spec[key] = f"{jnp.dtype(dtype).name}[{','.join(map(str, np.shape(leaf)))}]"
    return spec


def _digest(leaves) -> str:
    """sha256 of each (path text, leaf)'s path, dtype, shape and bytes, in order. Leaves split
    over several processes are gathered first, so every process computes the same digest."""
    digest = hashlib.sha256()
    for path, leaf in leaves:
        arr = np.ascontiguousarray(host_array(leaf))
        digest.update(f"{path}|{arr.dtype.name}|{arr.shape}|".encode())
        digest.update(arr.tobytes())
    return digest.hexdigest()


def state_digest(state_dict) -> str:
    """sha256 of every leaf's path, dtype, shape and bytes: written with a checkpoint and
    checked on restore, so a corrupted checkpoint is refused rather than loaded. Paths are
    spelled, and leaves ordered, as in the plain nested dict a checkpoint reads back as
    without a target (`restore_raw`): a dataclass's field (flashbax's buffer state) and a
    dict's key give the same digest. For a state of dicts alone it is the earlier spelling's
    (`_earlier_digest`)."""
    leaves = jax.tree_util.tree_flatten_with_path(state_dict)[0]
    # A dict's order: jax flattens its keys sorted, a dataclass's in field order.
    named = sorted(((_names(path), leaf) for path, leaf in leaves), key=lambda item: item[0])
    return _digest(("".join(f"[{name!r}]" for name in names), leaf) for names, leaf in named)


def _earlier_digest(state_dict, spec: dict[str, str]) -> str | None:
    """The digest as genesis-jax wrote it before `state_digest`'s spelling (jax's key paths of
    the saved tree, in its flattening order), of `state_dict` however it was read: into its
    target, or as plain dicts (`restore_raw`). The saved tree's paths come from the checkpoint's
    leaf spec (`_flat_spec`), written in that order with a dataclass's or namedtuple's field
    marked by a dot ("buffer/.current_index": flashbax's buffer state, SAC's transitions).
    None where `state_dict`'s leaves are not the spec's."""
    leaves = {"/".join(_names(path)): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(state_dict)[0]}
    saved = {key: "/".join(name.removeprefix(".") for name in key.split("/")) for key in spec}
    if sorted(saved.values()) != sorted(leaves):
        return None
    keystr = lambda key: "".join(n if n.startswith(".") else f"[{n!r}]" for n in key.split("/"))  # noqa: E731
    return _digest((keystr(key), leaves[saved[key]]) for key in spec)


def matches_digest(state_dict, digest: str, spec: dict[str, str]) -> bool:
    """Whether `digest` is `state_dict`'s, in this version's spelling or the earlier one
    (`spec`: the checkpoint's leaf spec, which the earlier spelling is read from)."""
    return state_digest(state_dict) == digest or _earlier_digest(state_dict, spec) == digest


def at_path(tree, path: tuple[str, ...]):
    """The object at `path` (attribute names) in a state, such as ("train_state",) in a PPO runner."""
    return functools.reduce(getattr, path, tree)


def set_in(tree: dict, path: tuple[str, ...], value) -> dict:
    """A copy of the nested state dict `tree` with `value` at `path`."""
    return {**tree, path[0]: set_in(tree[path[0]], path[1:], value)} if path else value


def _typed_differently(leaf, like) -> bool:
    both = isinstance(leaf, jax.Array) and isinstance(like, jax.Array)
    return both and (leaf.weak_type != like.weak_type or leaf.committed != like.committed)


def as_typed_as(state, template):
    """`state` (restored into `template`'s structure) with each array's weak type and
    commitment as in `template`, its buffers donated, not copied. A checkpoint holds neither:
    restored, a weakly typed leaf (an environment's `time = 0`, a replay buffer's index) comes
    back strongly typed and every leaf committed to its device, so the first program called on
    it would be another one than the run's from its initial state (a miss of the persistent
    compilation cache, and a weak leaf's type promotion changed)."""
    leaves, treedef = jax.tree.flatten(state)
    likes = treedef.flatten_up_to(template)
    changed = [i for i, (leaf, like) in enumerate(zip(leaves, likes)) if _typed_differently(leaf, like)]
    if not changed:
        return state
    abstract = [
        jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=x.weak_type, sharding=x.sharding if x.committed else None)
        for x in (likes[i] for i in changed)
    ]
    retyped = jax.jit(lambda xs: xs, donate_argnums=0).lower(abstract).compile()([leaves[i] for i in changed])
    for i, leaf in zip(changed, retyped):
        leaves[i] = leaf
    return jax.tree.unflatten(treedef, leaves)


def train_state_meta(train_state) -> dict:
    """What a checkpoint records of its `TrainState` (None: a state without one): its
    precision and loss-scaler type, so a restore can refuse a mismatch by name."""
    if not isinstance(train_state, TrainState):
        return {"precision": None, "scaler_type": None}
    return {"precision": train_state.precision, "scaler_type": type(train_state.scaler).__name__}


def check_kind(meta: dict, *, step: int, kind: str | None) -> None:
    """Refuses, in one sentence, a checkpoint of another workload (`kind` None: any)."""
    if kind is not None and meta.get("kind") != kind:
        raise CheckpointMismatchError(
            f"checkpoint at step {step} comes from a {meta.get('kind') or 'unknown'} run, not {kind}"
        )


def check_restorable(meta: dict, target: dict, *, step: int, kind: str | None = None) -> bool:
    """Refuses, in one sentence, a checkpoint (`meta`) that does not fit the run: another
    workload `kind`, another precision or scaler type (`target`, as `train_state_meta` gives
    it); `restore` compares the leaves. Returns whether the checkpoint has no scaler state where
    the run has one (an fp32 or bf16 run continued with loss scaling): the scaler then starts fresh."""
    check_kind(meta, step=step, kind=kind)
    saved_scaler, scaler = meta.get("scaler_type"), target["scaler_type"]
    if scaler is not None and saved_scaler == NoOpLossScale.__name__ and scaler != saved_scaler:
        return True
    if meta.get("precision") != target["precision"]:
        raise CheckpointMismatchError(
            f"checkpoint at step {step} was written in precision {meta.get('precision')!r}, "
            f"the run uses {target['precision']!r}"
        )
    if scaler is not None and saved_scaler != scaler:
        raise CheckpointMismatchError(f"checkpoint at step {step} holds a {saved_scaler} but the run uses a {scaler}")
    return False


def check_format(meta: dict, step: int, directory: str) -> None:
    """Refuses, in one sentence naming the version that wrote it, a checkpoint of another format."""
    found = meta.get("format", 1)
    if found in READABLE_FORMATS:
        return
    writer = meta.get("versions", {}).get("genesis-jax", "unknown")
    ours = package_versions().get("genesis-jax", "this version")
    raise CheckpointMismatchError(
        f"checkpoint at step {step} in {directory} was written by genesis-jax {writer} in checkpoint format {found}; "
        f"genesis-jax {ours} reads formats {', '.join(map(str, READABLE_FORMATS))}: "
        f"continue that run with genesis-jax {writer} "
        f"(pip install genesis-jax=={writer}), or start a new run (another --out, or --overwrite)"
    )


# -- a restored state is untrusted input ---------------------------------------------------


def _replay_count_rules(state, dropped: int = 0) -> list[Rule]:
    """A buffer's index and fill flag against the state's own count of the transitions it was
    given (`CountsReplay.replay_count`: DQN's steps, SAC's iterations), less the `dropped` ones
    a buffer grown after it wrapped never held (`replay_dropped`): flashbax writes the n-th to
    slot n mod capacity and is full from n = capacity on, so a buffer that never wrapped is not
    full and its index is n. Checked after the count itself (>= 0)."""
    if not isinstance(state, CountsReplay):
        return []
    counter, count, per_count = state.replay_count()
    count = host_array(count).astype(np.int64)
    buffer = state.buffer
    added = count * per_count - dropped
    capacity = np.shape(jax.tree.leaves(buffer.experience)[0])[np.ndim(buffer.current_index) + 1]
    rules = []
    for field, values, expected in (
        ("is_full", host_array(buffer.is_full), added >= capacity),
        ("current_index", host_array(buffer.current_index), added % capacity),
    ):
        good = values == expected
        at = np.unravel_index(np.argmin(good), np.shape(good))  # the first seed refused (named in its line)
        less = f" less {dropped} a smaller buffer dropped" if dropped else ""
        how = f"{counter} = {count[at]}: {added[at]} transitions added{less} to {capacity} slots filled in turn"
        rules.append((f"buffer.{field}", values, good, f"{expected[at].item()} ({how})"))
    return rules


def replay_dropped(state, dropped: int = 0) -> int:
    """The transitions `state`'s replay count holds that its buffer never did (recorded in its
    checkpoints as `replay_dropped`, for `_replay_count_rules`): `dropped` (those of the checkpoint
    it was restored from), or, for a buffer not full, its count less its index, as a buffer
    grown after it wrapped holds (`data.replay.grow`). 0 for a state without a buffer."""
    if not isinstance(state, CountsReplay):
        return 0
    _, count, per_count = state.replay_count()
    added = host_array(count).astype(np.int64) * per_count
    index, full = host_array(state.buffer.current_index), host_array(state.buffer.is_full)
    return int(np.max(np.where(full, dropped, added - index)))


def check_restored_state(state, *, step: int, directory: str, replay_dropped: int = 0) -> None:
    """Refuses, in one sentence naming the field, its value (and seed) and what is accepted, a
    restored `state` no run could have written: a checkpoint re-saved with a scale of 0, NaN or
    -1, impossible skip counts, a replay buffer's index past its slots. Its checksum matched,
    so the values were changed with intent or by a bug. The checks: those its types registered
    (`amp.restore`: train states, scalers, skips, replay buffers), optax's step counts, the
    state's own counters (signed-integer fields with one value per seed: DQN's and PQN's
    steps, SAC's iteration; never below 0) and its buffer against its count of what it
    added, less what a grown buffer dropped (`_replay_count_rules`)."""
    rules = [(prefix + field, *rest) for prefix, (field, *rest) in restore_rules(state, host_array)]
    named = [(_names(path), leaf) for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]]
    is_train_state = lambda node: isinstance(node, TrainState)  # noqa: E731
    train_states = [node for node in jax.tree.leaves(state, is_leaf=is_train_state) if is_train_state(node)]
    # the seed axis: a counter has one value per seed (a train state's own step is checked with it)
    seeds = np.shape(train_states[0].step) if train_states and not is_train_state(state) else None
    optimizer = [(n, x, "the updates the optimizer applied") for n, x in named if "opt_state" in n and n[-1] == "count"]
    counters = [(n, x, "a count of what the run did") for n, x in named if len(n) == 1 and np.shape(x) == seeds]
    for names, leaf, what in optimizer + counters:
        if jnp.issubdtype(leaf.dtype, jnp.signedinteger):
            count = host_array(leaf)
            rules.append((".".join(names), count, count >= 0, f">= 0 ({what})"))
    refuse_unwritten(rules + _replay_count_rules(state, replay_dropped), step=step, directory=directory)


def refuse_unwritten(rules: list[Rule], *, step: int, directory: str) -> None:
    """Refuses, in one sentence naming the field, its value, its seed and what is accepted,
    the first value of `rules` that no run writes."""
    for field, values, good, accepted in rules:
        bad = np.flatnonzero(~np.broadcast_to(good, np.shape(values)))
        if not bad.size:
            continue
        where = ""
        if np.ndim(values) == 1:
            where = f" (seed {int(bad[0])})"
        elif np.ndim(values) > 1:
            where = f" (at index {tuple(int(i) for i in np.unravel_index(bad[0], np.shape(values)))})"
        raise CheckpointMismatchError(
            f"checkpoint at step {step} in {directory} holds {field} = {np.ravel(values)[bad[0]].item()!r}{where}, "
            f"which must be {accepted}: no run writes that, so the checkpoint was altered; "
            "restore an intact copy, or start a new run (another --out, or --overwrite)"
        )


def position_of(meta: dict, key: str, step: int, directory: str) -> None:
    """The run position a checkpoint's meta records under `key`, refused in one sentence
    where it is not the step the checkpoint is stored as (a run saves them equal)."""
    _meta_integer(meta, key, step, directory, lambda value: value == step, f"not {step}")


def _meta_integer(meta: dict, key: str, step: int, directory: str, good, must: str, default=None) -> int:
    """The integer a checkpoint's meta records under `key` (`default` where it records none),
    refused in one sentence saying what it `must` be where it is not an integer or not `good`."""
    value = meta.get(key, default)
    if not is_int(value) or not good(value):  # meta is JSON: its integers are Python ints
        raise CheckpointMismatchError(
            f"checkpoint at step {step} in {directory} records {key} {value!r} in its meta, {must}: "
            "the checkpoint was altered; restore an intact copy, or start a new run"
        )
    return value


def _is_train_state_dict(node) -> bool:
    """A `TrainState`'s state dict in format 3: its scaler beside its pending-backoff flag."""
    return isinstance(node, dict) and "scaler" in node and "pending_backoff" in node


def as_format_2(tree):
    """A format-3 state dict in format 2's layout: each train state's scaler under its 0.2 name
    `loss_scale`, without the leaves 0.3 added (`pending_backoff`, the scaler's `backoffs`)."""
    if not isinstance(tree, dict):
        return tree
    if "backoffs" in tree and "growth_tracker" in tree:  # a dynamic scaler
        return {k: v for k, v in tree.items() if k != "backoffs"}
    if _is_train_state_dict(tree):
        tree = {("loss_scale" if k == "scaler" else k): v for k, v in tree.items() if k != "pending_backoff"}
    return {k: as_format_2(v) for k, v in tree.items()}


def from_format_2(restored, target):
    """`restored` (read in format 2's layout) in the layout of `target` (a format-3 state dict):
    the leaves format 2 lacks take `target`'s values, a fresh state's (no pending backoff,
    backoffs counted from this restore on)."""
    if not isinstance(target, dict):
        return restored
    if _is_train_state_dict(target):
        restored = {("scaler" if k == "loss_scale" else k): v for k, v in restored.items()}
    return {k: from_format_2(restored[k], v) if k in restored else v for k, v in target.items()}


def describe_differences(saved: dict[str, str], target: dict[str, str], limit: int = 5) -> str:
    """One sentence naming what differs between two leaf specs."""
    # Parameters first: they are what a reader recognises; optimizer moments repeat them.
    changed = sorted(
        (k for k in set(saved) & set(target) if saved[k] != target[k]), key=lambda k: (not k.startswith("params"), k)
    )
    parts = [f"{k}: checkpoint {saved[k]} vs run {target[k]}" for k in changed[:limit]]
    only = {"only in the checkpoint": set(saved) - set(target), "only in the run": set(target) - set(saved)}
    parts += [f"{what}: " + ", ".join(sorted(keys)[:limit]) for what, keys in only.items() if keys]
    return "; ".join(parts)


# -- Orbax's and TensorStore's failures, as one line -----------------------------------------

# TensorStore's errors, as Orbax passes them on, end in a dump of the TensorStore object
# ("See full TensorStore details: <bound method ...spec of TensorStore({...")); the detail
# worth reading is in the exception's cause.
_TENSORSTORE_DUMP = re.compile(r"\s*(See full TensorStore details:)?\s*<bound method .*$")
_OS_ERROR_CODE = re.compile(r"os_error_code='?(\d+)")
_STATUS_CODE = re.compile(r"^[A-Z][A-Z_]+: ")  # TensorStore's status: "OUT_OF_RANGE: ...", "DATA_LOSS: ..."


def error_line(err: BaseException) -> str:
    """The first line of an Orbax / TensorStore exception's message, without TensorStore's
    object dump; where the dump stood, its cause's line follows."""
    text = str(err).strip()
    first = text.splitlines()[0] if text else type(err).__name__
    line = _TENSORSTORE_DUMP.sub("", first)
    cause = err.__cause__ or err.__context__
    if line != first and cause is not None:
        line = f"{line.rstrip(' .:')}: {error_line(cause)}"
    return line[:300]


def save_failure(err: BaseException, step: int | None, directory: str) -> BaseException:
    """What a failed save raises: the system's failures (a full disk, a file too large, an
    unwritable directory: an `OSError`, or TensorStore's status text with its errno) become
    one `OSError` naming the errno's text and the step's directory; anything else is
    returned as it is."""
    code = err.errno if isinstance(err, OSError) else None
    if code is None:
        found = _OS_ERROR_CODE.search(str(err))
        code = int(found.group(1)) if found else (errno.EIO if _STATUS_CODE.match(str(err)) else None)
    if code is None:
        return err
    what = "a checkpoint" if step is None else f"the checkpoint of step {step}"
    where = directory if step is None else os.path.join(directory, str(step))
    return OSError(code, f"{os.strerror(code)} while saving {what} (the checkpoints saved before it are kept)", where)


_ORBAX_FILES = f"{os.sep}orbax{os.sep}"


class _OrbaxErrorLogs(logging.Filter):
    """Drops Orbax's own error logs (each a traceback from a background thread), and asyncio's
    "... exception was never retrieved" for the writes Orbax abandoned after the first one
    failed (into its temporary directory): the store raises the failure they report, once,
    as one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        if record.name == "asyncio":
            message = record.getMessage()
            return not ("exception was never retrieved" in message and TMP_MARK in message)
        return _ORBAX_FILES not in record.pathname


def _is_orbax_aftermath(unraisable) -> bool:
    """Whether an exception Python cannot raise anywhere is the echo of a failed Orbax write:
    Orbax closes its event loop when the first of its concurrent TensorStore writes fails,
    and the others, finishing later, schedule their results on the closed loop ("Event loop
    is closed"); the write coroutines it abandoned are finalized at exit."""
    exc = unraisable.exc_value
    if isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed":
        return "call_soon_threadsafe" in [frame.f_code.co_name for frame, _ in traceback.walk_tb(exc.__traceback__)]
    code = getattr(unraisable.object, "cr_code", None)
    return code is not None and _ORBAX_FILES in code.co_filename


def _quiet_orbax_echoes() -> None:
    """Once per process: the logs and unraisable exceptions that echo an Orbax failure the
    store reports itself are dropped; everything else passes as before."""
    for name in ("absl", "asyncio"):
        log = logging.getLogger(name)
        if not any(isinstance(f, _OrbaxErrorLogs) for f in log.filters):
            log.addFilter(_OrbaxErrorLogs())
    # An abandoned write that had not started yet is finalized with this warning.
    warnings.filterwarnings("ignore", r"coroutine '\S*write_fragment' was never awaited", RuntimeWarning)
    if getattr(sys.unraisablehook, "drops_orbax_echoes", False):
        return
    previous = sys.unraisablehook

    def hook(unraisable):
        if not _is_orbax_aftermath(unraisable):
            previous(unraisable)

    hook.drops_orbax_echoes = True
    sys.unraisablehook = hook


class CheckpointStore:
    """A `CheckpointManager` for one run directory (asynchronous saves, waited for on close).

    A save that fails for the system's reasons (a full disk) raises one `OSError` naming the
    step's directory and the errno's text, at that save, the next one, `wait` or `close`;
    the checkpoints saved before it stay intact."""

    def __init__(self, directory: str | os.PathLike, max_to_keep: int = 3, *, async_save: bool = True):
        if max_to_keep is not None and max_to_keep < 1:
            raise ValueError(f"max_to_keep must be >= 1, got {max_to_keep}")
        self.directory = os.path.abspath(os.fspath(directory))
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, enable_async_checkpointing=async_save, create=True
        )
        # A save cut short (a killed process) leaves a temporary directory that Orbax never
        # renamed into a step; restores ignore it. Say so, so the lost step is no surprise.
        leftovers = sorted(path.name for path in pathlib.Path(self.directory).glob(f"*{TMP_MARK}*"))
        if leftovers:
            logger.warning(
                f"ignoring {len(leftovers)} incomplete checkpoint(s) in {self.directory} (a save was interrupted): "
                + ", ".join(leftovers)
            )
        _quiet_orbax_echoes()
        self._pending: int | None = None  # the step of a save not yet waited for
        with self._writing(None):
            self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "meta"))

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())  # Orbax's, in the order saved

    def discard(self, steps) -> None:
        """Deletes the checkpoints at `steps` (every process takes part)."""
        for step in steps:
            self._manager.delete(step)

    def save(
        self, step: int, state, meta: dict | None = None, force: bool = False, train_state_path: tuple[str, ...] = ()
    ) -> bool:
        """Saves `state` at `step`, with `meta` and what
        restores check: the precision and scaler type of the `TrainState` at `train_state_path`,
        every leaf's shape and dtype, and a checksum. Returns whether it saved: a step already
        saved with the same content is not saved again; with other content it is refused, and so
        is a step below the newest (a step counter restarted), unless `force`.

        Raises:
            OSError: this save, or the one before it, failed for the system's reasons.
            CheckpointMismatchError: `step` holds a checkpoint of another state, or is below the newest."""
        step = int(step)
        state_dict = jax.tree.map(jnp.asarray, serialization.to_state_dict(state))
        full_meta = {
            **(meta or {}),
            "step": step,
            "format": CHECKPOINT_FORMAT,
            **train_state_meta(at_path(state, train_state_path)),
            "versions": package_versions(),
            "spec": _flat_spec(state_dict),
            "digest": state_digest(state_dict),
        }
        self.wait()  # a failure of the save before this one is raised here, naming its step
        steps = self.all_steps()  # Orbax alone would skip, without a word, every step up to the newest
        if step in steps:  # the same state is not saved again; another one is refused
            saved = self.read_meta(step)
            if matches_digest(state_dict, saved.get("digest", ""), saved["spec"]):
                return False
            raise CheckpointMismatchError(
                f"checkpoint at step {step} in {self.directory} already exists with other contents; "
                "a step is saved once: save this state at another step"
            )
        if steps and step < steps[-1] and not force:
            raise CheckpointMismatchError(
                f"step {step} is below the newest checkpoint in {self.directory}, {steps[-1]}: a run's steps only "
                "grow (a step counter restarted after a restore?); save at a later step, or pass force=True"
            )
        with self._writing(step):
            args = ocp.args.Composite(state=ocp.args.StandardSave(state_dict), meta=ocp.args.JsonSave(full_meta))
            saved = self._manager.save(step, args=args, force=True)
        if saved:
            self._pending = step
        return saved

    @contextlib.contextmanager
    def _writing(self, step: int | None):
        """Turns a failed write into `save_failure`'s one exception."""
        try:
            yield
        except Exception as err:
            gc.collect()  # the write coroutines Orbax abandoned end now, not noisily at exit
            failure = save_failure(err, step, self.directory)
            if failure is err:
                raise
            raise failure from err

    def read_meta(self, step: int | None = None) -> dict:
        step = self.resolve_step(step)
        with self._readable(step):
            meta = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
        if not isinstance(meta, dict) or "spec" not in meta:
            raise CheckpointMismatchError(
                f"checkpoint at step {step} in {self.directory} was not written by genesis-jax"
            )
        check_format(meta, step, self.directory)
        position_of(meta, "step", step, self.directory)
        return meta

    @contextlib.contextmanager
    def _readable(self, step: int):
        """Turns Orbax's errors on a damaged or foreign checkpoint into one clear sentence."""
        try:
            yield
        except Exception as err:  # Orbax raises many kinds here; the user needs one sentence
            raise CheckpointMismatchError(
                f"checkpoint at step {step} in {self.directory} cannot be read (corrupted or not a genesis-jax "
                f"checkpoint): {error_line(err)}{self._older_ones(step)}"
            ) from err

    def _older_ones(self, step: int) -> str:
        """Where a damaged checkpoint is not the only one: how to use the newest older one."""
        older = [s for s in self.all_steps() if s < step]
        if not older:
            return ""
        listed = ", ".join(map(str, older))
        return f"; older checkpoints remain ({listed}): move {self.directory}/{step} aside to continue from {older[-1]}"

    def resolve_step(self, step: int | None) -> int:
        """`step`, or the newest complete one; FileNotFoundError where there is none."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        return step

    def read_state(self, step: int, meta: dict, abstract=None, allow_unverified: bool = False) -> dict:
        """The state dict saved at `step` (into `abstract`'s shapes, dtypes and shardings where
        given), once its checksum matches `meta`'s. Every checkpoint of this format is written
        with one: one without is refused unless `allow_unverified`."""
        args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract))
        with self._readable(step):
            state = self._manager.restore(step, args=args)["state"]
        where = f"checkpoint at step {step} in {self.directory}"
        if "digest" not in meta:
            if not allow_unverified:
                raise CheckpointMismatchError(
                    f"{where} has no checksum, so its content cannot be verified (genesis-jax writes one with every "
                    "checkpoint); restore it anyway with --allow-unverified-checkpoint (Python: allow_unverified=True)"
                )
            logger.warning("%s has no checksum: restored unverified", where)
        elif not matches_digest(state, meta["digest"], meta["spec"]):
            raise CheckpointMismatchError(
                f"{where} is corrupted: its content does not match the checksum saved with it" + self._older_ones(step)
            )
        return state

    def restore_raw(self, step: int | None = None, allow_unverified: bool = False) -> tuple[dict, dict]:
        """The newest (or given) step as a plain nested dict of arrays, and its meta
        (`allow_unverified`: read a checkpoint without a checksum, refused otherwise)."""
        step = self.resolve_step(step)
        meta = self.read_meta(step)
        return self.read_state(step, meta, allow_unverified=allow_unverified), meta

    def restore(
        self,
        target,
        step: int | None = None,
        kind: str | None = None,
        train_state_path: tuple[str, ...] = (),
        allow_unverified: bool = False,
    ) -> tuple[Any, dict]:
        """Restores the newest (or given) step into the structure, dtypes, weak types and
        shardings of `target` (`as_typed_as`): a run resumed calls the program its initial state did.

        Args:
            target: a state of the run's structure (its values are not used).
            step: the step to restore (default: the newest).
            kind: the workload the checkpoint must come from ("ppo", "world-model"; None: any).
            train_state_path: where the `TrainState` sits in `target` (() for a `TrainState` itself).
            allow_unverified: restore a checkpoint without a checksum (refused otherwise).

        Returns:
            (the restored state, the checkpoint's meta).

        Raises:
            CheckpointMismatchError: in one sentence, for a checkpoint that does not fit the run,
                fails its checksum, has none (unless `allow_unverified`), or holds values no run
                writes (`check_restored_state`).
        """
        step = self.resolve_step(step)
        meta = self.read_meta(step)
        target_dict = serialization.to_state_dict(target)
        train_state = at_path(target, train_state_path)
        scaler_path = (*train_state_path, "scaler")
        fresh_scaler = check_restorable(meta, train_state_meta(train_state), step=step, kind=kind)
        as_saved = target_dict  # the target in the checkpoint's layout
        if fresh_scaler:  # read the checkpoint's scaler-less state, then give the run its fresh scaler
            as_saved = set_in(as_saved, scaler_path, serialization.to_state_dict(NoOpLossScale()))
        legacy = meta.get("format") == 2
        if legacy:
            as_saved = as_format_2(as_saved)
        saved_spec, target_spec = meta.get("spec", {}), _flat_spec(as_saved)
        if saved_spec != target_spec:
            raise CheckpointShapeError(step, describe_differences(saved_spec, target_spec))
        # The target's shardings, not the saved ones: a checkpoint written on N devices restores onto however
        # many; a host array's (numpy: `load`'s zeros) is the default device's, or Orbax takes the saved one.
        one_device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])

        def abstract(x):
            return jax.ShapeDtypeStruct(np.shape(x), jnp.asarray(x).dtype, sharding=getattr(x, "sharding", one_device))

        restored = self.read_state(step, meta, jax.tree.map(abstract, as_saved), allow_unverified=allow_unverified)
        if legacy:
            restored = from_format_2(restored, target_dict)
        if fresh_scaler:
            logger.warning(
                f"checkpoint at step {step} has no loss-scaler state (precision {meta.get('precision')}); "
                "the scaler starts from its defaults"
            )
            restored = set_in(restored, scaler_path, serialization.to_state_dict(train_state.scaler))
        # the scaler's kind is checked above (its meta): a static scale a resume changes is taken as saved
        state = as_typed_as(serialization.from_state_dict(any_fixed_scale(target), restored), target)
        must = "which must be an integer >= 0"
        dropped = _meta_integer(meta, "replay_dropped", step, self.directory, lambda n: n >= 0, must, default=0)
        check_restored_state(state, step=step, directory=self.directory, replay_dropped=dropped)
        return state, meta

    def wait(self):
        """Waits for the pending save; raises its failure (once) as `save_failure` says."""
        step, self._pending = self._pending, None
        with self._writing(step):
            self._manager.wait_until_finished()

    def close(self):
        """Waits for the pending save and closes the manager, also after a failed save, so
        none of its threads outlives the store; raises the pending save's failure."""
        try:
            self.wait()
        except BaseException:
            with contextlib.suppress(Exception):  # the failure above is the one to report
                self._manager.close()
            raise
        with self._writing(None):
            self._manager.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
