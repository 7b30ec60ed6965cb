"""The algorithms, each on the template of `genesis_jax.algos.base`.

`REGISTRY` maps a `genesis-jax train NAME` subcommand to the module whose `ALGORITHM` is
the `Algorithm` subclass: registering one of this package is a line of `_HELP`; another
package's is an entry point of the group `genesis_jax.algorithms` (or `register`). Everything else
(the CLI command, bench workloads, study tasks, the API reference page, the generic tests,
the import contract that keeps algorithms apart) is derived from it. Modules load on first
use, so the CLI starts without importing every algorithm.
"""

import dataclasses
import functools
import importlib
import importlib.metadata
import warnings

# name: the `genesis-jax train` help line; its module: genesis_jax.algos.<name, "_" for "-">.train
_HELP = {
    "ppo": "PPO on a gymnax, gymnasium or envpool environment",
    "world-model": "a world model from trajectories (synthetic, random-policy or collected)",
    "dqn": "double DQN with a flashbax replay buffer on a gymnax or gymnasium (ALE Atari) environment",
    "sac": "SAC (twin critics, learned temperature; three optimizers under one loss scaler) on a continuous "
    "gymnax or gymnasium environment",
    "pqn": "PQN: Q(lambda) over many environments, no replay or target network",
}
# name: (module, help line)
REGISTRY = {name: (f"genesis_jax.algos.{name.replace('-', '_')}.train", text) for name, text in _HELP.items()}
PLUGINS = "genesis_jax.algorithms"  # the entry-point group of algorithms other packages register


def register(name: str, module: str, help: str) -> None:
    """Registers the algorithm of `module` (its `ALGORITHM`, or "module:Class") as `name`, from
    another package: a name another module holds is refused (a dict entry would replace ppo silently)."""
    if not importlib.metadata.EntryPoint.pattern.match(module):  # read as an entry point's value, by `_load`
        raise ValueError(f"algorithm {name!r}: {module!r} is no 'package.module' or 'package.module:Class'")
    held = REGISTRY.get(name, (module,))[0]
    if held != module:
        raise ValueError(f"algorithm name {name!r} is taken by {held}: give {module}'s algorithm another name")
    REGISTRY[name] = (module, help)


def _register_plugins(entry_points) -> None:
    """The algorithms installed packages declare (`[project.entry-points."genesis_jax.algorithms"]`,
    `NAME = "module"` or `"module:Class"`): `genesis-jax train NAME` without editing this file.
    One that clashes is left out with a warning, as `loadable` leaves out one that fails to
    load: a bad plugin never stops the other commands."""
    for point in entry_points:
        try:
            register(point.name, point.value, f"{point.value} (installed)")
        except ValueError as err:
            warnings.warn(f"{PLUGINS} entry point left out: {err}", stacklevel=2)


_register_plugins(importlib.metadata.entry_points(group=PLUGINS))


def get_algorithm(name: str):
    """The `Algorithm` subclass registered as `name`, its declarations checked (`check_declarations`)."""
    if name not in REGISTRY:
        raise ValueError(f"unknown algorithm {name!r}; accepted: {', '.join(REGISTRY)}")
    return _load(name, REGISTRY[name][0])


def loadable() -> dict:
    """Every registered algorithm's class by name, for the tools that go through them all
    (bench, study, eval): another package's that fails to load is left out with a warning,
    so that it stops only its own commands (a built-in's failure raises)."""
    classes = {}
    for name, (module, _) in REGISTRY.items():
        try:
            classes[name] = get_algorithm(name)
        except Exception as err:  # whatever another package's import raises
            if module.startswith(f"{__name__}."):
                raise
            warnings.warn(f"algorithm {name!r} ({module}) left out: {err}", stacklevel=2)
    return classes


def bench_workloads(quick: bool) -> dict:
    """Every loadable algorithm's `BenchWorkload`s of `bench --quick` (or of the full bench) by
    name, each with its `kind`; a name two algorithms give is refused."""
    named = [
        (algo, w.name, dataclasses.replace(w, kind=algo))
        for algo, algorithm in loadable().items()
        for w in algorithm.presets.bench
        if w.quick == quick
    ]
    return _by_name("bench workload", named)


def study_tasks() -> dict:
    """Every loadable algorithm's `StudyTask`s by name, each with its `algo` and `budget_field`;
    a name two algorithms give is refused."""
    named = [
        (algo, name, dataclasses.replace(task, algo=algo, budget_field=algorithm.budget_field))
        for algo, algorithm in loadable().items()
        for name, task in algorithm.presets.study.items()
    ]
    return _by_name("study task", named)


def _by_name(what: str, named: list) -> dict:
    found, owners = {}, {}
    for algo, name, preset in named:
        if name in owners:
            raise ValueError(f"{what} {name!r} is named by {owners[name]} and {algo}")
        found[name], owners[name] = preset, algo
    return found


@functools.cache
def _load(name: str, module: str):
    # An entry point's "module:Class" (as importlib.metadata reads it: "module:Outer.Inner [extra]"
    # too), or a module whose ALGORITHM names the class.
    point = importlib.metadata.EntryPoint(name, module, PLUGINS)
    attr = point.attr or "ALGORITHM"
    algorithm = functools.reduce(
        lambda obj, part: getattr(obj, part, None), attr.split("."), importlib.import_module(point.module)
    )
    if not isinstance(algorithm, type):  # an AttributeError said nothing of what the template reads
        what = "name its class: ALGORITHM = <its Algorithm subclass>" if not point.attr else f"have a class {attr}"
        raise TypeError(f"algorithm {name!r}: module {point.module} must {what}")
    check_declarations(name, algorithm)
    return algorithm


def check_declarations(name: str, algorithm) -> None:
    """What the template and the tools around it read from an algorithm's class, checked once
    when it is first loaded: a TypeError naming the declaration that is wrong."""

    from genesis_jax.algos.base import Algorithm  # here: the CLI imports this module without JAX

    def fail(what: str):
        raise TypeError(f"algorithm {name!r} ({algorithm.__module__}.{algorithm.__name__}): {what}")

    if not issubclass(algorithm, Algorithm):
        fail("it must subclass genesis_jax.algos.base.Algorithm")
    # The template's own raise NotImplementedError, with no message, once the run is compiling.
    for signature in ("init(self, key) -> state", "update(self, state, data) -> (state, metrics)"):
        hook = signature.split("(")[0]
        if getattr(algorithm, hook) is getattr(Algorithm, hook):
            fail(f"fill in `{signature}`")

    if getattr(algorithm, "name", None) != name:
        fail(f"its `name` must be the registry's {name!r}, got {getattr(algorithm, 'name', None)!r}")
    config_class, fields = getattr(algorithm, "config_class", None), getattr(algorithm, "fields", None)
    if not (dataclasses.is_dataclass(config_class) and isinstance(fields, type) and issubclass(config_class, fields)):
        fail("`config_class` must be a dataclass deriving from its `fields` dataclass")
    known = {f.name for f in dataclasses.fields(config_class)}
    presets = getattr(algorithm, "presets", None)  # a `Presets` where declared (`Algorithm` checks the type)
    if presets is None or not presets.tiny:
        fail("`presets.tiny` (the settings of a few-row run, for the generic tests) is not set")
    settings = [("tiny", presets.tiny)]
    settings += [(f"bench workload {w.name!r}", w.settings) for w in presets.bench]
    settings += [(f"study task {t!r}", task.settings) for t, task in presets.study.items()]
    for what, given in settings:
        unknown = sorted(set(given) - known)
        if unknown:
            fail(f"{what} sets {unknown[0]!r}, which is not a field of {config_class.__name__}")
    if algorithm.budget_field not in known:
        fail(f"`budget_field` {algorithm.budget_field!r} is not a field of {config_class.__name__}")
    # Built now, not when a run starts: a default its annotation refuses (`lr: int = 0.8`) or a bad preset value.
    for what, given, fix in [
        ("its default config", {}, "that field's default or annotation"),
        ("`presets.tiny`", presets.tiny, "the preset"),
    ]:
        try:
            config_class(**given)
        except (TypeError, ValueError) as err:
            fail(f"{what} is refused ({err}): fix {fix}")
