"""The docs' ```python blocks are tests: pytest-markdown-docs's items, one per block.

This conftest collects the pages of docs/ itself rather than through `--markdown-docs`,
which would also import every .py file of the suite a second time to search its docstrings.
Info strings use the brace form, the one Material for MkDocs renders (docs/contributing-docs.md):
`{.python notest}` is not run, `{.python continuation}` runs after the page's previous block,
and `{.python slow}` puts a block (and every block continuing from it) in the slow lane. A
block not marked slow that takes over FAST_BLOCK_CPU_SECONDS of CPU time fails: mark it or
shrink its budget. CPU time, not wall time: a machine busy with other work does not trip it.
"""

import functools
import pathlib
import time

import pytest
from markdown_it import MarkdownIt
from pytest_markdown_docs.plugin import MarkdownTextFile, parse_superfences_block_info

# The slow marker's "~4 s on 2 CPU cores" is up to ~8 s of CPU time; a block far over it fails. (The
# docs' blocks took at most 8 s of wall time and 13 s of CPU time when this was written.)
FAST_BLOCK_CPU_SECONDS = 40.0
PYTHON = ("py", "python", "python3")


@functools.cache
def slow_blocks(path: pathlib.Path) -> frozenset[int]:
    """The start lines (as pytest-markdown-docs counts them) of the page's slow blocks: those
    marked slow, and those continuing a chain that holds one (a continuation re-runs it)."""
    slow, chain_slow = set(), False
    for token in MarkdownIt("commonmark").parse(path.read_text("utf8")):
        info = parse_superfences_block_info(token.info) if token.type == "fence" else []
        if not info or info[0] not in PYTHON or "notest" in info or not token.map:
            continue
        chain_slow = ("slow" in info) or ("continuation" in info and chain_slow)
        if chain_slow:
            slow.add(token.map[0] + 1)
    return frozenset(slow)


def pytest_configure(config):
    # The brace form of info strings ({.python notest}), the one pymdownx.superfences renders.
    config.option.markdowndocs_syntax = "superfences"


def pytest_collect_file(file_path, parent):
    if file_path.suffix == ".md" and not parent.config.option.markdowndocs:  # not twice with --markdown-docs
        return MarkdownTextFile.from_parent(parent, path=file_path)
    return None


def _is_docs_block(item) -> bool:
    return item.get_closest_marker("markdown-docs") is not None and item.path.suffix == ".md"


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(items):
    for item in items:
        if _is_docs_block(item) and item.start_line in slow_blocks(item.path):
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    start = time.process_time()  # this process's CPU time, all its threads (XLA's too)
    result = yield
    seconds = time.process_time() - start
    if _is_docs_block(item) and item.get_closest_marker("slow") is None and seconds > FAST_BLOCK_CPU_SECONDS:
        pytest.fail(
            f"this docs block took {seconds:.0f} s of CPU time, over the fast lane's {FAST_BLOCK_CPU_SECONDS:.0f} s: "
            "shrink its budget or mark its fence {.python slow}",
            pytrace=False,
        )
    return result
