"""mkdocs hook: the parts of the pages that the algorithm registry writes, so that a new
algorithm (a line of `genesis_jax.algos._HELP`) appears in the docs by itself.

A page holds `<!-- registry: KIND -->`, which becomes: `commands`, a table row per
`genesis-jax train NAME`; `reference`, a section per algorithm with its `train`, its config
and its fields (mkdocstrings blocks); `algorithms`, their names as a phrase; `fields`, links
to their fields classes; `train-examples`, a `genesis-jax train` line each. No page lists the
algorithms by hand (tests/e2e/test_docs_registry.py checks it)."""

from __future__ import annotations

import re

MARKER = re.compile(r"<!-- registry: ([\w-]+) -->")


def train_commands() -> str:
    from genesis_jax.algos import REGISTRY

    return "\n".join(f"| `genesis-jax train {name}` | {help_line} |" for name, (_, help_line) in REGISTRY.items())


def reference() -> str:
    from genesis_jax.algos import REGISTRY, get_algorithm

    sections = []
    for name, (module, help_line) in REGISTRY.items():
        algorithm, package = get_algorithm(name), module.rsplit(".", 1)[0]
        blocks = [f"::: {package}.train", f"::: {package}.{algorithm.config_class.__name__}"]
        # The shared field groups' fields too (run.config), each with its group's text.
        blocks.append(f"::: {package}.{algorithm.fields.__name__}\n    options:\n      inherited_members: true")
        sections.append(f"## `{name}`\n\n{help_line[0].upper()}{help_line[1:]}.\n\n" + "\n\n".join(blocks))
    return "\n\n".join(sections)


def display_name(name: str) -> str:
    """How prose names a registered algorithm: its acronym (`ppo`: PPO), else its words."""
    return name.upper() if len(name) <= 3 else "a " + name.replace("-", " ")


def algorithm_list() -> str:
    """The registered algorithms as a phrase: "PPO, a world model, DQN, SAC and PQN"."""
    from genesis_jax.algos import REGISTRY

    names = [display_name(name) for name in REGISTRY]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def fields_links() -> str:
    """A link to each algorithm's own fields class, for the CLI page."""
    from genesis_jax.algos import REGISTRY, get_algorithm

    links = []
    for name, (module, _) in REGISTRY.items():
        fields = get_algorithm(name).fields.__name__
        links.append(f"[`{fields}`][{module.rsplit('.', 1)[0]}.{fields}]")
    return ", ".join(links[:-1]) + " or " + links[-1]


def train_examples() -> str:
    """A `genesis-jax train` line per algorithm, at its defaults (its default environment or data)."""
    from genesis_jax.algos import REGISTRY

    return "\n".join(f"genesis-jax train {name} --precision fp16 --out runs/{name}" for name in REGISTRY)


WRITERS = {
    "commands": train_commands,
    "reference": reference,
    "algorithms": algorithm_list,
    "fields": fields_links,
    "train-examples": train_examples,
}


def expand(markdown: str) -> str:
    """`markdown` with each registry marker replaced by what it stands for."""
    return MARKER.sub(lambda m: WRITERS[m.group(1)](), markdown)


def on_page_markdown(markdown: str, **_) -> str:
    return expand(markdown)
