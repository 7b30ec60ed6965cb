"""The documentation site (mkdocs.yml, docs/): the API reference covers `genesis_jax.amp`,
every public amp function and class shows an example, and the pages' code blocks are
written so that both pytest-markdown-docs (which runs them, docs/conftest.py) and Material
(which renders them) read them; the README's code blocks run here, by the same rules.
`mkdocs build --strict` itself runs in CI (.ci/run)."""

import importlib.util
import inspect
import pathlib
import re
import tomllib

import griffe
import pytest
from markdown_it import MarkdownIt
from pytest_markdown_docs.plugin import FenceSyntax, extract_fence_tests

from genesis_jax import amp

REPO = pathlib.Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
README = REPO / "README.md"

# Names of amp.__all__ that hold a value, not a function or class: a `>>>` example cannot
# live in their docstring (Python keeps none for a value), so they are exempt from it; they
# carry an attribute docstring (the string after the assignment), which the reference shows.
NO_EXAMPLE = {
    "PRECISION_NAMES",
    "LossScale",  # a type alias (a union of the three scalers)
    "FLOAT32_RULES",
}


def test_every_public_amp_name_is_in_the_reference():
    page = (DOCS / "reference" / "amp.md").read_text()
    listed = re.findall(r"^::: genesis_jax\.amp\.(\w+)$", page, re.M)
    assert sorted(listed) == sorted(amp.__all__), "docs/reference/amp.md lists other names than amp.__all__"


@pytest.mark.parametrize("name", sorted(set(amp.__all__) - NO_EXAMPLE))
def test_every_public_amp_function_and_class_has_an_example(name):
    doc = inspect.getdoc(getattr(amp, name)) or ""
    assert ">>>" in doc, f"amp.{name}'s docstring has no `>>>` example (--doctest-modules runs them)"


def test_the_exemptions_are_values_with_attribute_docstrings():
    # The exemption list stays minimal: a function or class in it would lose its example check.
    for name in NO_EXAMPLE:
        obj = getattr(amp, name)
        assert not (inspect.isfunction(obj) or inspect.isclass(obj)), f"amp.{name} is not a value: remove it"
    package = griffe.load("genesis_jax.amp", search_paths=[str(REPO)])
    for name in NO_EXAMPLE:
        assert package[name].docstring is not None, f"amp.{name} needs an attribute docstring"


def _fences(text: str):
    return [t for t in MarkdownIt("commonmark").parse(text) if t.type == "fence"]


@pytest.mark.parametrize("page", PAGES + [README], ids=lambda p: str(p.relative_to(REPO)))
def test_code_block_options_are_in_the_form_material_renders(page):
    # pymdownx.superfences reads "```python notest" as no fence at all (the block shows as
    # text, silently); "```{.python notest}" renders, and pytest-markdown-docs reads it.
    for fence in _fences(page.read_text("utf8")):
        words = fence.info.split()
        extra = [w for w in words[1:] if "=" not in w]  # key="value" options (title=...) are fine
        assert not (words and not words[0].startswith("{") and extra), (
            f"{page.name}:{fence.map[0] + 1}: write ```{{.{words[0]} {' '.join(extra)}}}, not ```{fence.info}"
        )


def _readme_blocks():
    text = README.read_text("utf8")
    return list(extract_fence_tests(MarkdownIt("commonmark"), text, 0, README, fence_syntax=FenceSyntax.superfences))


@pytest.mark.parametrize("block", _readme_blocks(), ids=lambda b: f"README.md:{b.start_line}")
def test_the_readme_code_blocks_run(block):
    # As docs/conftest.py runs the pages' blocks: each from an empty namespace ({.python
    # continuation}: after the previous one), with tracebacks at the README's own lines.
    exec(compile(block.source, str(README), "exec"), {"__name__": "__main__"})


def test_the_suite_collects_the_docs_code_blocks():
    options = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "docs" in options["testpaths"]  # docs/conftest.py collects the pages' blocks
    blocks = [
        f
        for page in PAGES
        for f in _fences(page.read_text("utf8"))
        if f.info.strip("{} ").lstrip(".").split()[:1] in (["python"], ["py"], ["python3"])
    ]
    assert blocks, "no ```python block in docs/: is the docs directory there?"


def test_the_cli_page_names_every_command():
    from genesis_jax.algos import REGISTRY
    from genesis_jax.cli import build_parser

    page = registry_hook().expand((DOCS / "reference" / "cli.md").read_text())
    commands = next(a for a in build_parser()._actions if a.dest == "command").choices
    for command in commands:
        if command == "train":
            for workload in REGISTRY:
                assert f"`genesis-jax train {workload}`" in page
        else:
            assert f"`genesis-jax {command}`" in page


def registry_hook():
    """docs/hooks.py, the mkdocs hook that writes the registry's parts of the pages."""
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_algorithm_reference_has_a_section_per_registered_algorithm():
    from genesis_jax.algos import REGISTRY

    page = registry_hook().expand((DOCS / "reference" / "algorithms.md").read_text())
    for name, (module, _) in REGISTRY.items():
        assert f"## `{name}`" in page and f"::: {module}\n" in page + "\n"


def test_every_page_is_in_the_navigation():
    nav = (REPO / "mkdocs.yml").read_text().split("\nnav:\n", 1)[1]
    for page in PAGES:
        assert f": {page.relative_to(DOCS).as_posix()}\n" in nav + "\n", f"{page} is not in mkdocs.yml's nav"


# The pages that list what the registry holds: each algorithm must be on each, by name.
REGISTRY_PAGES = ["index.md", "quickstart.md", "reference/cli.md", "algorithms.md"]


@pytest.mark.parametrize("page", REGISTRY_PAGES)
def test_every_registered_algorithm_is_on_the_pages_that_list_them(page):
    from genesis_jax.algos import REGISTRY

    hooks = registry_hook()
    text = hooks.expand((DOCS / page).read_text())
    for name in REGISTRY:
        shown = hooks.display_name(name).removeprefix("a ")
        assert shown in text, f"docs/{page} never names {shown} (registered as {name!r})"
        assert f"genesis-jax train {name}" in text or page in ("index.md", "algorithms.md")


def test_the_home_page_lists_every_registered_algorithm_and_a_row_for_the_study():
    from genesis_jax.algos import REGISTRY

    text = registry_hook().expand((DOCS / "index.md").read_text())
    for name in REGISTRY:
        assert text.count(registry_hook().display_name(name)) >= 3, name  # for whom, start here, the layers
    assert "| [The precision study](study.md) |" in text


# Material's content column holds about 82 monospace characters at a 1280-pixel window (a
# block of 84 scrolled sideways in headless Chromium, its end hidden); the front door's pages
# keep every line of every block, the home page's layer diagram included, within 80.
COLUMN_PAGES = ["index.md", "quickstart.md", "study.md"]


@pytest.mark.parametrize("page", COLUMN_PAGES)
def test_the_front_doors_code_blocks_fit_the_content_column(page):
    too_wide = [
        f"docs/{page}:{fence.map[0] + 2 + i}: {len(line)} characters"
        for fence in _fences((DOCS / page).read_text("utf8"))
        for i, line in enumerate(fence.content.splitlines())
        if len(line) > 80
    ]
    assert not too_wide, "lines wider than the column (80): " + "; ".join(too_wide)


def test_the_command_line_help_names_no_single_algorithm():
    from genesis_jax.cli import build_parser

    assert "PPO" not in build_parser().description


def test_the_readme_names_every_registered_algorithm_within_120_lines():
    from genesis_jax.algos import REGISTRY

    text = README.read_text()
    assert len(text.splitlines()) <= 120
    for name in REGISTRY:
        assert registry_hook().display_name(name).removeprefix("a ") in text, name
