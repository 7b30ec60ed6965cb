"""The command's end (`genesis_jax.cli._exit_now`): run as `genesis-jax` (or `python -m
genesis_jax.cli`), it skips Python's teardown of the loaded modules, yet exits with the
command's status, its output whole and its atexit handlers run; a process with another
thread still working ends as usual, after that thread. Run inside another program (`main(argv)`),
it leaves that program's logging and compile cache as they were."""

import json

import pytest

from tests.support.processes import cpu_env, run_python

DEMO = ["-m", "genesis_jax.cli", "demo", "--steps", "3"]


def test_the_command_exits_with_its_status_and_its_whole_output():
    done = run_python(DEMO, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["training_steps"] == 3, done.stdout
    refused = run_python(["-m", "genesis_jax.cli", "train", "ppo", "--precision", "fp17"], timeout=300)
    assert refused.returncode == 2, (refused.returncode, refused.stderr)
    assert refused.stderr.strip().splitlines()[-1].startswith("genesis-jax train ppo: error:"), refused.stderr
    assert "Traceback" not in refused.stderr, refused.stderr


def test_the_atexit_handlers_run_and_a_working_thread_finishes(tmp_path):
    marker = tmp_path / "thread-finished"
    script = (
        "import atexit, sys, threading, time\n"
        "atexit.register(lambda: print('atexit ran', flush=True))\n"
        f"threading.Thread(target=lambda: (time.sleep(1), open({str(marker)!r}, 'w').close())).start()\n"
        "sys.argv = ['genesis-jax', 'demo', '--steps', '3']\n"
        "from genesis_jax.cli import main\n"
        "sys.exit(main())\n"
    )
    done = run_python(["-c", script], timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "atexit ran"
    assert marker.exists()  # the thread was waited for: the usual exit


def test_a_deprecated_spelling_is_said_in_one_line(capsys):
    import warnings

    from genesis_jax import cli

    with cli._one_line_warnings(), warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("epsilon-steps is deprecated and goes in 0.5", FutureWarning, stacklevel=1)
    assert capsys.readouterr().err == "genesis-jax: warning: epsilon-steps is deprecated and goes in 0.5\n"


def test_a_command_inside_a_program_leaves_its_logging_and_compile_cache(tmp_path):
    # `main(argv)` in a test or a notebook: the command's log handler and levels and its compile
    # cache were its run's; they left the program logging every library's INFO lines and keeping
    # every program it compiled after in the user's cache folder.
    import logging

    import absl.logging  # noqa: F401  (before getLogger("absl"), as the command does: absl's logger is its own)
    import jax

    from genesis_jax.cli import main

    root, absl = logging.getLogger(), logging.getLogger("absl")
    kept_handlers, kept_levels = root.handlers[:], (root.level, absl.level)
    kept_min_time = jax.config.jax_persistent_cache_min_compile_time_secs
    root.handlers[:] = []  # a program that has not configured logging (pytest's capture set aside)
    root.setLevel(logging.WARNING)
    absl.setLevel(logging.DEBUG)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 5.0)
    try:
        assert main(["eval", str(tmp_path / "no-run")]) == 2  # past the point where a command sets them
        assert (root.handlers, root.level, absl.level) == ([], logging.WARNING, logging.DEBUG)
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 5.0
    finally:
        root.handlers[:] = kept_handlers
        root.setLevel(kept_levels[0])
        absl.setLevel(kept_levels[1])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", kept_min_time)


@pytest.mark.slow  # a fresh process: JAX sets its persistent cache up once a process
def test_a_command_inside_a_program_leaves_no_compile_cache_behind(tmp_path):
    # Putting the cache's options back did not undo JAX's cache object: the program's own later
    # compiles went on being written to the command's folder.
    env = {k: v for k, v in cpu_env().items() if k != "JAX_COMPILATION_CACHE_DIR"} | {"XDG_CACHE_HOME": str(tmp_path)}
    script = (
        "import pathlib, jax, jax.numpy as jnp\n"
        "jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)  # the program caches all it may\n"
        "from genesis_jax.cli import main\n"
        "assert main(['demo', '--steps', '2']) == 0\n"
        f"cache = pathlib.Path({str(tmp_path)!r}) / 'genesis-jax' / 'xla'\n"
        "before = len(list(cache.iterdir()))\n"
        "jax.jit(lambda x: jnp.sin(x) * 3.25)(jnp.ones(7)).block_until_ready()  # the program's own\n"
        "print(before, len(list(cache.iterdir())))\n"
    )
    done = run_python(["-c", script], env=env)
    assert done.returncode == 0, done.stderr
    before, after = map(int, done.stdout.split()[-2:])
    assert before > 0 and after == before  # the command cached its programs; the program's own is not there


@pytest.mark.slow  # a fresh process: which class absl's logger is is decided once, as absl is imported
def test_absls_logger_stays_absls_own_after_a_command():
    # getLogger("absl") before absl's import made it a plain Logger: log_first_n then counted every
    # call site as one (Orbax's warnings among them), in the run and in the program after it.
    script = "import logging\nfrom genesis_jax.cli import main\nmain(['eval', '/no/such/run'])\n"
    done = run_python(["-c", script + "print(type(logging.getLogger('absl')).__name__)"])
    assert done.returncode == 0 and done.stdout.split()[-1] == "ABSLLogger", done.stderr


@pytest.mark.slow  # a fresh process: JAX sets its persistent cache up once a process
def test_a_command_inside_a_program_that_compiled_first_caches_in_its_own_folder(tmp_path):
    # JAX had set its cache up at the program's first compile (in the program's folder), and the
    # command's programs went there; a program with the cache off kept it off for the command too.
    env = {k: v for k, v in cpu_env().items() if k != "JAX_COMPILATION_CACHE_DIR"} | {"XDG_CACHE_HOME": str(tmp_path)}
    script = (
        "import pathlib, jax, jax.numpy as jnp\n"
        f"jax.config.update('jax_compilation_cache_dir', {str(tmp_path / 'own')!r})\n"
        "jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)\n"
        "jax.jit(lambda x: x + 1)(jnp.ones(3)).block_until_ready()  # the program's own, first\n"
        "from genesis_jax.cli import main\n"
        "assert main(['demo', '--steps', '2']) == 0\n"
        f"print(len(list((pathlib.Path({str(tmp_path)!r}) / 'genesis-jax' / 'xla').iterdir())))\n"
    )
    done = run_python(["-c", script], env=env)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) > 0  # the command's programs, cached where it says
