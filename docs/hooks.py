"""mkdocs hook: the parts of the pages that the algorithm registry writes, so that a new
algorithm (one line in `genesis_jax.algos.REGISTRY`) appears in the docs by itself.

A page holds `<!-- registry: KIND -->`, which becomes: `commands`, a table row per
`genesis-jax train NAME`; `reference`, a section per algorithm with its `train`, its config
and its fields (mkdocstrings blocks)."""

from __future__ import annotations

import re

MARKER = re.compile(r"<!-- registry: (\w+) -->")


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


WRITERS = {"commands": train_commands, "reference": reference}


def expand(markdown: str) -> str:
    """`markdown` with each registry marker replaced by what it stands for."""
    return MARKER.sub(lambda m: WRITERS[m.group(1)](), markdown)


def on_page_markdown(markdown: str, **_) -> str:
    return expand(markdown)
