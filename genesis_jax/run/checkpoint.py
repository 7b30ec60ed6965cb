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
import hashlib
import importlib.metadata
import logging
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import serialization

from genesis_jax.amp.loss_scale import SCALER_TYPES, NoOpLossScale
from genesis_jax.run.parallel import host_array

logger = logging.getLogger("genesis_jax")

# Orbax writes each step into "<step>.orbax-checkpoint-tmp..." and renames it when complete.
TMP_MARK = ".orbax-checkpoint-tmp"

# The layout of a checkpoint's state. 2: the skip counts and the guard's halted flag live in
# the optimizer state (amp.skip_nonfinite), the train state holds no PRNG key. Format 1
# (genesis-jax 0.1) checkpoints are refused with the version that can continue them.
CHECKPOINT_FORMAT = 2

_VERSIONED_PACKAGES = ("genesis-jax", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "jmp", "numpy")


class CheckpointMismatchError(ValueError):
    """A checkpoint does not fit the state it is restored into."""


def _scaler_to_state_dict(scaler):
    return {f: getattr(scaler, f) for f in scaler._fields}


def _scaler_from_state_dict(target, state):
    return target._replace(**{f: jnp.asarray(state[f], getattr(target, f).dtype) for f in target._fields})


for _cls in SCALER_TYPES.values():
    serialization.register_serialization_state(_cls, _scaler_to_state_dict, _scaler_from_state_dict, override=True)


def package_versions() -> dict[str, str]:
    versions = {}
    for name in _VERSIONED_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return versions


def _flat_spec(state_dict) -> dict[str, str]:
    """'path/to/leaf' -> 'float32[64,4]' for every leaf."""
    leaves = jax.tree_util.tree_flatten_with_path(state_dict)[0]
    spec = {}
    for path, leaf in leaves:
        key = "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
        arr = np.asarray(leaf) if not hasattr(leaf, "dtype") else leaf
        spec[key] = f"{jnp.dtype(arr.dtype).name}[{','.join(map(str, np.shape(arr)))}]"
    return spec


def state_digest(state_dict) -> str:
    """sha256 of every leaf's path, dtype, shape and bytes: written with a checkpoint and
    checked on restore, so a corrupted checkpoint is refused rather than loaded. Leaves split
    over several processes are gathered first, so every process computes the same digest."""
    digest = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(state_dict)[0]:
        arr = np.ascontiguousarray(host_array(leaf))
        digest.update(f"{jax.tree_util.keystr(path)}|{arr.dtype.name}|{arr.shape}|".encode())
        digest.update(arr.tobytes())
    return digest.hexdigest()


def at_path(tree, path: tuple[str, ...]):
    """The object at `path` (attribute names) in a state, such as ("train_state",) in a PPO runner."""
    for name in path:
        tree = getattr(tree, name)
    return tree


def set_in(tree: dict, path: tuple[str, ...], value) -> dict:
    """A copy of the nested state dict `tree` with `value` at `path`."""
    if not path:
        return value
    return {**tree, path[0]: set_in(tree[path[0]], path[1:], value)}


def train_state_meta(train_state) -> dict:
    """What a checkpoint records of its `TrainState` (None: a state without one): its
    precision and loss-scaler type, so a restore can refuse a mismatch by name."""
    if train_state is None or not hasattr(train_state, "loss_scale"):
        return {"precision": None, "scaler_type": None}
    return {"precision": train_state.precision, "scaler_type": type(train_state.loss_scale).__name__}


def check_restorable(meta: dict, target: dict, *, step: int, kind: str | None = None) -> bool:
    """Refuses, in one sentence, a checkpoint (`meta`) that does not fit the run: another
    workload `kind`, another precision or scaler type (`target`, as `train_state_meta` gives
    it); `check_spec` compares the leaves. Returns whether the checkpoint has no scaler state where the run has one (an
    fp32 or bf16 run continued with loss scaling): the scaler then starts fresh."""
    if kind is not None and meta.get("kind") != kind:
        saved_kind = meta.get("kind") or "unknown"
        raise CheckpointMismatchError(f"checkpoint at step {step} comes from a {saved_kind} run, not {kind}")
    saved_scaler, scaler = meta.get("scaler_type"), target["scaler_type"]
    fresh_scaler = scaler is not None and saved_scaler == NoOpLossScale.__name__ and scaler != saved_scaler
    if not fresh_scaler and meta.get("precision") != target["precision"]:
        raise CheckpointMismatchError(
            f"checkpoint at step {step} was written in precision {meta.get('precision')!r}, "
            f"the run uses {target['precision']!r}"
        )
    if not fresh_scaler and scaler is not None and saved_scaler != scaler:
        raise CheckpointMismatchError(f"checkpoint at step {step} holds a {saved_scaler} but the run uses a {scaler}")
    return fresh_scaler


def check_format(meta: dict, step: int, directory: str) -> None:
    """Refuses, in one sentence naming the version that wrote it, a checkpoint of another format."""
    found = meta.get("format", 1)
    if found == CHECKPOINT_FORMAT:
        return
    writer = meta.get("versions", {}).get("genesis-jax", "unknown")
    ours = package_versions().get("genesis-jax", "this version")
    raise CheckpointMismatchError(
        f"checkpoint at step {step} in {directory} was written by genesis-jax {writer} in checkpoint format {found}; "
        f"genesis-jax {ours} reads format {CHECKPOINT_FORMAT} only: continue that run with genesis-jax {writer} "
        f"(pip install genesis-jax=={writer}), or start a new run (another --out, or --overwrite)"
    )


def check_spec(meta: dict, target_dict: dict, *, step: int) -> None:
    """Refuses a checkpoint whose leaves differ from `target_dict`'s, naming the differences."""
    saved_spec, target_spec = meta.get("spec", {}), _flat_spec(target_dict)
    if saved_spec != target_spec:
        raise CheckpointMismatchError(
            f"checkpoint at step {step} does not fit this run: {describe_differences(saved_spec, target_spec)}"
        )


def abstract_like(target_dict: dict):
    """Shapes, dtypes and shardings to read a checkpoint into: the target's shardings, not
    the saved ones, so a checkpoint written on N devices restores onto however many this run has."""
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(np.shape(x), jnp.asarray(x).dtype, sharding=getattr(x, "sharding", None)),
        target_dict,
    )


def restore(
    store: "CheckpointStore",
    target,
    step: int | None = None,
    kind: str | None = None,
    train_state_path: tuple[str, ...] = (),
) -> tuple[Any, dict]:
    """Restores the newest (or given) step of `store` into the structure and dtypes of `target`.

    Args:
        store: where the checkpoints are.
        target: a state of the run's structure (its values are not used).
        step: the step to restore (default: the newest).
        kind: the workload the checkpoint must come from ("ppo", "world-model"; None: any).
        train_state_path: where the `TrainState` sits in `target` (() for a `TrainState` itself).

    Returns:
        (the restored state, the checkpoint's meta).
    """
    step = store.resolve_step(step)
    meta = store.read_meta(step)
    target_dict = serialization.to_state_dict(target)
    train_state = at_path(target, train_state_path)
    scaler_path = tuple(train_state_path) + ("loss_scale",)
    fresh_scaler = check_restorable(meta, train_state_meta(train_state), step=step, kind=kind)
    if fresh_scaler:  # read the checkpoint's scaler-less state, then give the run its fresh scaler
        target_dict = set_in(target_dict, scaler_path, serialization.to_state_dict(NoOpLossScale()))
    check_spec(meta, target_dict, step=step)
    restored = store.read_state(step, meta, abstract_like(target_dict))
    if fresh_scaler:
        logger.warning(
            "checkpoint at step %d has no loss-scaler state (precision %s); the scaler starts from its defaults",
            step,
            meta.get("precision"),
        )
        restored = set_in(restored, scaler_path, serialization.to_state_dict(train_state.loss_scale))
    return serialization.from_state_dict(target, restored), meta


def describe_differences(saved: dict[str, str], target: dict[str, str], limit: int = 5) -> str:
    """One sentence naming what differs between two leaf specs."""
    missing = sorted(set(saved) - set(target))
    extra = sorted(set(target) - set(saved))
    # Parameters first: they are what a reader recognises; optimizer moments repeat them.
    changed = sorted(
        (k for k in set(saved) & set(target) if saved[k] != target[k]), key=lambda k: (not k.startswith("params"), k)
    )
    parts = []
    if changed:
        parts.append("; ".join(f"{k}: checkpoint {saved[k]} vs run {target[k]}" for k in changed[:limit]))
    if missing:
        parts.append("only in the checkpoint: " + ", ".join(missing[:limit]))
    if extra:
        parts.append("only in the run: " + ", ".join(extra[:limit]))
    return "; ".join(parts)


class CheckpointStore:
    """A `CheckpointManager` for one run directory (asynchronous saves, waited for on close)."""

    def __init__(
        self, directory: str | os.PathLike, max_to_keep: int = 3, save_interval_steps: int = 1, async_save: bool = True
    ):
        if max_to_keep is not None and max_to_keep < 1:
            raise ValueError(f"max_to_keep must be >= 1, got {max_to_keep}")
        if save_interval_steps < 1:
            raise ValueError(f"save_interval_steps must be >= 1, got {save_interval_steps}")
        self.directory = os.path.abspath(os.fspath(directory))
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            save_interval_steps=save_interval_steps,
            enable_async_checkpointing=async_save,
            create=True,
        )
        self._warn_incomplete()
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "meta"))

    def _warn_incomplete(self):
        """A save cut short (a killed process) leaves a temporary directory that Orbax never
        renamed into a step; restores ignore it. Say so, so the lost step is no surprise."""
        if not os.path.isdir(self.directory):
            return
        leftovers = sorted(name for name in os.listdir(self.directory) if TMP_MARK in name)
        if leftovers:
            logger.warning(
                "ignoring %d incomplete checkpoint(s) in %s (a save was interrupted): %s",
                len(leftovers),
                self.directory,
                ", ".join(leftovers),
            )

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def save(
        self, step: int, state, meta: dict | None = None, force: bool = False, train_state_path: tuple[str, ...] = ()
    ) -> bool:
        """Saves `state` at `step` (if the interval says so, or `force`), with `meta` and what
        restores check: the precision and scaler type of the `TrainState` at `train_state_path`,
        every leaf's shape and dtype, and a checksum. Returns whether it saved."""
        state_dict = jax.tree.map(jnp.asarray, serialization.to_state_dict(state))
        full_meta = {
            **(meta or {}),
            "step": int(step),
            "format": CHECKPOINT_FORMAT,
            **train_state_meta(at_path(state, train_state_path)),
            "versions": package_versions(),
            "spec": _flat_spec(state_dict),
            "digest": state_digest(state_dict),
        }
        return self._manager.save(
            int(step),
            args=ocp.args.Composite(state=ocp.args.StandardSave(state_dict), meta=ocp.args.JsonSave(full_meta)),
            force=force,
        )

    def read_meta(self, step: int | None = None) -> dict:
        step = self.resolve_step(step)
        with self._readable(step):
            meta = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
        if not isinstance(meta, dict) or "spec" not in meta:
            raise CheckpointMismatchError(
                f"checkpoint at step {step} in {self.directory} was not written by genesis-jax"
            )
        check_format(meta, step, self.directory)
        return meta

    @contextlib.contextmanager
    def _readable(self, step: int):
        """Turns Orbax's errors on a damaged or foreign checkpoint into one clear sentence."""
        try:
            yield
        except CheckpointMismatchError:
            raise
        except Exception as err:  # Orbax raises many kinds here; the user needs one sentence
            detail = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
            raise CheckpointMismatchError(
                f"checkpoint at step {step} in {self.directory} cannot be read (corrupted or not a genesis-jax "
                f"checkpoint): {detail}"
            ) from err

    def _verified(self, step: int, meta: dict, state: dict) -> dict:
        """`state` as read, once its checksum matches the one saved with it (checkpoints
        written before checksums existed have none to check)."""
        if "digest" in meta and state_digest(state) != meta["digest"]:
            raise CheckpointMismatchError(
                f"checkpoint at step {step} in {self.directory} is corrupted: its content does not match the checksum "
                "saved with it"
            )
        return state

    def resolve_step(self, step: int | None) -> int:
        """`step`, or the newest complete one; FileNotFoundError where there is none."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        return step

    def read_state(self, step: int, meta: dict, abstract=None) -> dict:
        """The state dict saved at `step` (into `abstract`'s shapes, dtypes and shardings where
        given), once its checksum matches `meta`'s."""
        restore_args = ocp.args.StandardRestore(abstract) if abstract is not None else ocp.args.StandardRestore()
        with self._readable(step):
            state = self._manager.restore(step, args=ocp.args.Composite(state=restore_args))["state"]
        return self._verified(step, meta, state)

    def restore_raw(self, step: int | None = None) -> tuple[dict, dict]:
        """The newest (or given) step as a plain nested dict of arrays, and its meta."""
        step = self.resolve_step(step)
        meta = self.read_meta(step)
        return self.read_state(step, meta), meta

    def restore(
        self, target, step: int | None = None, kind: str | None = None, train_state_path: tuple[str, ...] = ()
    ) -> tuple[Any, dict]:
        """`restore(self, ...)`: the checks and migrations are the module's pure functions."""
        return restore(self, target, step, kind, train_state_path)

    def wait(self):
        self._manager.wait_until_finished()

    def close(self):
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
