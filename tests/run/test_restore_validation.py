"""A checkpoint is untrusted input: a restore refuses, in one line naming the field and its
value, a state no run writes (re-saved with a valid checksum, so only the values give it
away), a meta whose step is not its directory's, and a checkpoint without a checksum unless
unverified ones are allowed; the run directory stays byte-identical. A save that fails for
the system's reasons is one OSError (CLI: one line, exit 4) with the checkpoints before it
intact, and a step saved twice is a no-op (same state) or one line (another state)."""

import errno
import glob
import json
import os
import pathlib
import shutil
import textwrap

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

from genesis_jax import amp
from genesis_jax.cli import EXIT_BAD_INPUT, EXIT_SYSTEM, main
from genesis_jax.run.checkpoint import CheckpointMismatchError, CheckpointStore, save_failure, state_digest
from genesis_jax.run.session import Session
from tests.support.files import snapshot
from tests.support.processes import cpu_env, run_python
from tests.support.small_run import SMALL, ppo_argv

X = jax.random.normal(jax.random.PRNGKey(0), (16, 4))
Y = X.sum(-1)


def loss_fn(params, batch):  # the matmul in float16, as fp16 computes; the loss in float32
    prediction = batch[0].astype(jnp.float16) @ params["w"].astype(jnp.float16)
    return jnp.mean((prediction.astype(jnp.float32) - batch[1]) ** 2), None


def fresh_state():
    scaler = amp.DynamicLossScale(init_scale=2.0**10, growth_interval=3, min_scale=1.0)
    return amp.TrainState.create(params={"w": jnp.zeros(4)}, tx=optax.sgd(0.05), scaler=scaler, precision="fp16")


CHUNK = jax.jit(lambda state: amp.train_step(state, loss_fn, (X, Y), has_aux=True))


def rows(metrics, done):
    return [{"update": done + 1, "loss": float(metrics["loss"])}]


def run(out, total, **options):
    """A toy run under a `Session`: one update per position, a checkpoint after each."""
    with Session(out, name="toy", num_rows=total, checkpoint_every=1, progress=False, **options) as session:
        state = session.restore(fresh_state())
        state = session.run(state, CHUNK, rows)
        return session.finish({}), state


def resave(checkpoints: pathlib.Path, step: int, change_state=None, change_meta=None) -> None:
    """Re-saves checkpoint `step` with Orbax itself, as other software would: the state with
    `change_state` applied (and a checksum that matches it), the meta with `change_meta`."""
    with CheckpointStore(checkpoints, async_save=False) as store:
        state, meta = store.restore_raw(step)
    state = jax.tree.map(np.asarray, state)
    if change_state is not None:
        change_state(state)
        meta["digest"] = state_digest(state)
    if change_meta is not None:
        change_meta(meta)
    shutil.rmtree(checkpoints / str(step))
    manager = ocp.CheckpointManager(checkpoints, item_names=("state", "meta"))
    manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)))
    manager.close()


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "toy"
    run(out, 2)
    return out


@pytest.fixture
def run_copy(toy_run, tmp_path):
    return pathlib.Path(shutil.copytree(toy_run, tmp_path / "run"))


def setter(*path, value):
    def change(tree):
        for key in path[:-1]:
            tree = tree[key]
        tree[path[-1]] = np.asarray(value, np.asarray(tree[path[-1]]).dtype)

    return change


def setting(key, value):
    return lambda meta: meta.__setitem__(key, value)


TAMPERED = {
    "scale 0": (setter("scaler", "loss_scale", value=0.0), None, "scaler.loss_scale = 0.0"),
    "scale NaN": (setter("scaler", "loss_scale", value=np.nan), None, "scaler.loss_scale = nan"),
    "scale inf": (setter("scaler", "loss_scale", value=np.inf), None, "scaler.loss_scale = inf"),
    "scale -1": (setter("scaler", "loss_scale", value=-1.0), None, "scaler.loss_scale = -1.0"),
    "scale below its floor": (setter("scaler", "loss_scale", value=0.5), None, "scaler.loss_scale = 0.5"),
    "backoff 2": (setter("scaler", "backoff_factor", value=2.0), None, "scaler.backoff_factor = 2.0"),
    "growth factor 1": (setter("scaler", "growth_factor", value=1.0), None, "scaler.growth_factor = 1.0"),
    "growth interval 0": (setter("scaler", "growth_interval", value=0), None, "scaler.growth_interval = 0"),
    "tracker at its interval": (setter("scaler", "growth_tracker", value=3), None, "growth_tracker = 3"),
    "tracker negative": (setter("scaler", "growth_tracker", value=-1), None, "growth_tracker = -1"),
    "backoffs negative": (setter("scaler", "backoffs", value=-1), None, "scaler.backoffs = -1"),
    "skipped negative": (setter("opt_state", "skipped", value=-1), None, "opt_state.skipped = -1"),
    "skipped above the step": (setter("opt_state", "skipped", value=7), None, "opt_state.skipped = 7"),
    "streak negative": (setter("opt_state", "consecutive_skips", value=-2), None, "consecutive_skips = -2"),
    "meta step": (None, setting("step", 5), "records step 5 in its meta, not 2"),
    "meta update": (None, setting("update", 7), "records update 7 in its meta, not 2"),
    "no checksum": (None, lambda meta: meta.pop("digest"), "has no checksum"),
}


@pytest.mark.parametrize("case", list(TAMPERED))
def test_a_tampered_checkpoint_is_refused_in_one_line_and_the_run_is_untouched(run_copy, case):
    change_state, change_meta, words = TAMPERED[case]
    resave(run_copy / "checkpoints", 2, change_state, change_meta)
    before = snapshot(run_copy)
    with pytest.raises(CheckpointMismatchError) as err:
        run(run_copy, 3, resume=True)
    message = str(err.value)
    assert "\n" not in message and words in message, message
    assert f"checkpoint at step 2 in {run_copy / 'checkpoints'}" in message, message
    assert snapshot(run_copy) == before  # nothing on disk changed


def test_the_untampered_run_resumes(run_copy):
    """The control: the same resave with nothing changed passes every check."""
    resave(run_copy / "checkpoints", 2, change_state=lambda state: None)
    summary, state = run(run_copy, 3, resume=True)
    assert int(state.step) == 3 and "unverified_checkpoint" not in summary


def test_a_checkpoint_without_a_checksum_resumes_when_allowed_and_the_summary_says_so(run_copy):
    resave(run_copy / "checkpoints", 2, change_meta=lambda meta: meta.pop("digest"))
    summary, state = run(run_copy, 3, resume=True, allow_unverified=True)
    assert int(state.step) == 3  # two updates restored, one more run
    assert summary["unverified_checkpoint"] == 2
    assert json.loads((run_copy / "summary.json").read_text())["unverified_checkpoint"] == 2
    with CheckpointStore(run_copy / "checkpoints", async_save=False) as store:  # the raw read: the same rule
        with pytest.raises(CheckpointMismatchError, match="has no checksum"):
            store.restore_raw(2)
        raw, meta = store.restore_raw(2, allow_unverified=True)
    assert "digest" not in meta and raw


def test_the_seed_of_a_bad_value_is_named(tmp_path):
    seeds = jax.tree.map(lambda x: jnp.stack([x, x, x]), fresh_state())
    with CheckpointStore(tmp_path / "c", async_save=False) as store:
        store.save(4, seeds, {"kind": "toy"})
    resave(tmp_path / "c", 4, setter("scaler", "backoff_factor", value=[0.5, 0.5, 1.0]))
    with CheckpointStore(tmp_path / "c", async_save=False) as store:
        with pytest.raises(CheckpointMismatchError, match=r"scaler\.backoff_factor = 1\.0 \(seed 2\)"):
            store.restore(seeds)


class TwoStates(flax.struct.PyTreeNode):
    actor: amp.TrainState
    critic: amp.TrainState


def test_every_train_state_of_a_state_is_checked_not_only_the_one_the_run_reads_its_scale_from(tmp_path):
    """SAC holds three train states sharing one scaler; its `train_state_path` names the critic."""
    state = TwoStates(actor=fresh_state(), critic=fresh_state())
    with CheckpointStore(tmp_path / "c", async_save=False) as store:
        store.save(4, state, {"kind": "toy"}, train_state_path=("critic",))
    resave(tmp_path / "c", 4, setter("actor", "scaler", "loss_scale", value=np.inf))
    with CheckpointStore(tmp_path / "c", async_save=False) as store:
        with pytest.raises(CheckpointMismatchError, match=r"holds actor\.scaler\.loss_scale = inf,"):
            store.restore(state, train_state_path=("critic",))


def test_a_damaged_checkpoint_is_named_in_one_line_without_tensorstores_object_dump(tmp_path):
    # An array large enough for a data file of its own (small ones sit inside OCDBT's index).
    with CheckpointStore(tmp_path / "c", async_save=False) as store:
        store.save(1, {"w": jax.random.normal(jax.random.PRNGKey(1), (4000,))}, {"kind": "toy"})
    data = max(glob.glob(str(tmp_path / "c" / "1" / "state" / "**" / "d" / "*"), recursive=True), key=os.path.getsize)
    with open(data, "r+b") as f:
        f.truncate(8)
    with CheckpointStore(tmp_path / "c", async_save=False) as store:
        with pytest.raises(CheckpointMismatchError) as err:
            store.restore_raw(1)
    message = str(err.value)
    assert "\n" not in message and "checkpoint at step 1" in message and "cannot be read" in message, message
    assert "bound method" not in message and "pybind11" not in message, message
    assert "Error reading" in message, message  # TensorStore's own detail, from the cause


@pytest.mark.parametrize("force", [True, False])
def test_a_step_saved_twice_is_a_no_op_for_the_same_state_and_refused_for_another(tmp_path, force):
    """Unforced too: Orbax alone skipped a step up to the newest without a word (a loop whose step
    counter restarted after a restore never saved again)."""
    state = fresh_state()
    with CheckpointStore(tmp_path / "c") as store:  # asynchronous saves, as a run makes them
        assert store.save(3, state, {"kind": "toy"}, force=force)
        assert store.save(3, state, {"kind": "toy"}, force=force) is False
        store.wait()
        before = snapshot(tmp_path / "c")
        other = state.replace(params={"w": jnp.ones(4)})
        with pytest.raises(CheckpointMismatchError, match="checkpoint at step 3 .* already exists with other contents"):
            store.save(3, other, {"kind": "toy"}, force=force)
        if not force:  # a step below the newest: refused unforced, saved forced
            with pytest.raises(CheckpointMismatchError, match="step 2 is below the newest checkpoint .*, 3: a run's"):
                store.save(2, other, {"kind": "toy"})
            assert snapshot(tmp_path / "c") == before
            assert store.save(2, other, {"kind": "toy"}, force=True) and store.all_steps() == [2, 3]
            return
    assert snapshot(tmp_path / "c") == before


def test_a_session_saving_twice_at_one_position_saves_once(tmp_path):
    with Session(tmp_path / "r", name="toy", num_rows=1, progress=False) as session:
        state = session.restore(fresh_state())
        state = session.run(state, CHUNK, rows)  # saves at position 1
        session.save(state)
        session.finish({})
        assert session.store.all_steps() == [1]


def test_an_oserror_from_a_save_becomes_one_naming_the_steps_directory(tmp_path):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    with CheckpointStore(tmp_path / "c", async_save=False) as store:
        store.save(1, fresh_state(), {"kind": "toy"})
        before = snapshot(tmp_path / "c")
        store._manager.save = full  # the disk fills up before step 2
        with pytest.raises(OSError) as err:
            store.save(2, fresh_state(), {"kind": "toy"})
    assert err.value.errno == errno.ENOSPC and err.value.filename == str(tmp_path / "c" / "2")
    assert "No space left on device while saving the checkpoint of step 2" in err.value.strerror
    assert snapshot(tmp_path / "c") == before


def test_tensorstores_status_text_carries_the_errno():
    text = 'OUT_OF_RANGE: Error writing "w/0": Failed to write 99 bytes: No space left on device [os_error_code=28]'
    assert save_failure(ValueError(text), 4, "/ck").errno == errno.ENOSPC
    assert save_failure(ValueError("DATA_LOSS: bad chunk"), 4, "/ck").errno == errno.EIO
    bug = TypeError("not a storage failure")
    assert save_failure(bug, 4, "/ck") is bug


# The toy run through the command line's error handling, in a fresh process whose files may
# not grow past 16 KiB (RLIMIT_FSIZE: a write past it fails with EFBIG, as a full disk would
# with ENOSPC); the new checkpoint's data file is larger, a metric row is not.
FULL_DISK_CLI = textwrap.dedent(
    """
    import resource, signal, sys
    import jax, jax.numpy as jnp, optax
    from genesis_jax import amp, cli
    from genesis_jax.run.session import Session

    w = jax.random.normal(jax.random.PRNGKey(0), (40000,))  # incompressible: 160 kB a checkpoint
    loss_fn = lambda p, b: (jnp.mean(p["w"] * b), None)
    chunk = jax.jit(lambda s: amp.train_step(s, loss_fn, jnp.float32(1e-9), has_aux=True))

    def train(workload, parts, run):
        state = amp.TrainState.create(params={"w": w}, tx=optax.sgd(1e-9), precision="fp16")
        with Session(run.out, name="toy", num_rows=int(sys.argv[2]), checkpoint_every=1, progress=False,
                     resume=run.resume) as session:
            state = session.run(session.restore(state), chunk, lambda m, done: [{"update": done + 1}])
            session.finish({})
        return 0

    cli._run_train = train
    if sys.argv[3] == "full":
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))
    resume = ["--resume"] if sys.argv[3] == "full" else []
    sys.exit(cli.main(["train", "ppo", "--out", sys.argv[1], "--no-progress", *resume]))
    """
)


@pytest.mark.slow  # two fresh processes importing the command line: 23-26 s on 2 busy cores
def test_a_full_disk_mid_save_exits_4_in_one_line_and_keeps_the_earlier_checkpoints(tmp_path):
    out = tmp_path / "run"
    made = run_python(["-c", FULL_DISK_CLI, str(out), "2", "fits"], timeout=300)
    assert made.returncode == 0, made.stderr[-3000:]
    before = snapshot(out / "checkpoints")
    # Every write of this process past the limit fails: the shared compilation cache's too (a warning).
    full = run_python(["-c", FULL_DISK_CLI, str(out), "4", "full"], cpu_env(compile_cache=False), timeout=300)
    err = full.stderr.strip().splitlines()
    assert full.returncode == EXIT_SYSTEM, full.stderr[-3000:]
    assert len(err) == 1, full.stderr[-3000:]  # no traceback, no Orbax log, no "Event loop is closed"
    assert err[0] == (
        "genesis-jax: system failure: File too large while saving the checkpoint of step 3 "
        f"(the checkpoints saved before it are kept): {out / 'checkpoints' / '3'}"
    )
    after = snapshot(out / "checkpoints")
    assert {k: v for k, v in after.items() if k in before} == before  # checkpoints 1 and 2 intact
    with CheckpointStore(out / "checkpoints", async_save=False) as store:
        assert store.all_steps() == [1, 2]
        store.restore_raw(2)  # still reads, checksum and all


@pytest.mark.slow  # a PPO run through the command line (SMALL: compiled once a test run), a refused resume
def test_the_command_line_refuses_a_tampered_ppo_checkpoint_with_status_2(tmp_path, capsys):
    assert main([*SMALL, "--out", str(tmp_path / "ppo")]) == 0
    checkpoints = tmp_path / "ppo" / "checkpoints"
    step = CheckpointStore(checkpoints).latest_step()
    resave(checkpoints, step, setter("train_state", "scaler", "loss_scale", value=np.nan))
    before = snapshot(tmp_path / "ppo")
    capsys.readouterr()
    assert main([*ppo_argv(4096), "--out", str(tmp_path / "ppo"), "--resume"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "train_state.scaler.loss_scale = nan" in err[0], err
    assert snapshot(tmp_path / "ppo") == before
