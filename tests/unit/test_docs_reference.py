"""The manual's generated reference pages (docs/gen_reference.py) are complete, deterministic and well-formed."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path

import pytest

from rocket.config import NodeConfig
from rocket.transport.methods import METHODS

SCRIPT = Path(__file__).parents[2] / "docs" / "gen_reference.py"


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("gen_reference", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # imported, not run: it writes no pages and needs no mkdocs
    return module


@pytest.fixture(scope="module")
def pages(gen):
    return {path: build() for path, build in gen.PAGES.items()}


def rows(page: str) -> list[str]:
    """The first cell of every table row, without its code span."""
    return [match.strip("`") for match in re.findall(r"^\| (`[^`]+`) \|", page, re.M)]


def test_every_cli_command_has_a_section(gen, pages):
    paths = [path for path, _, _ in gen.cli_commands()]
    assert paths[0] == "rocket" and {"rocket run", "rocket topic create", "rocket kv bucket create"} <= set(paths)
    assert re.findall(r"^## (.+)$", pages["reference/cli.md"], re.M) == paths
    assert pages["reference/cli.md"].count("```text\nUsage: rocket") == len(paths)


def test_every_config_field_has_a_row(pages):
    page = pages["reference/config.md"]
    assert rows(page) == [field.name for field in dataclasses.fields(NodeConfig)]
    assert "TOML file < ROCKET_* environment < command-line flags" in page
    assert "| `tcp_idle_s` |" in page and "`ROCKET_TCP_IDLE_S`" in page and "`--data-dir`" in page


def test_config_descriptions_come_from_the_source_comments(gen):
    comments = gen.field_comments(NodeConfig)
    assert comments["tls_mode"].startswith("enforcing: only TLS on the TCP port")
    assert comments["http2_tls_cert"].startswith("with http2_tls_key")  # a comment after the code, on its line
    assert comments["segment_bytes"].startswith("ignored")  # the comment above tls_mode is tls_mode's alone


def test_every_rpc_method_has_a_row_and_a_role(pages):
    page = pages["reference/rpc.md"]
    assert sorted(rows(page)) == sorted(METHODS)
    assert "Served by no role" not in page  # a method no role registers (or one registered where the script
    # does not look) would be listed under it


def test_pages_are_deterministic_and_tables_well_formed(gen, pages):
    assert {path: build() for path, build in gen.PAGES.items()} == pages
    for path, page in pages.items():
        assert page.startswith("# ") and "Generated from the code by `docs/gen_reference.py`" in page, path
        for table in re.findall(r"(?:^\|.*\|\n)+", page, re.M):
            # cells split at each | outside code spans and not escaped, as Python-Markdown's tables split them
            widths = {len(re.split(r"(?<!\\)\|", re.sub(r"`+[^`]*`+", "", line))) for line in table.splitlines()}
            assert len(widths) == 1, (path, table[:200])
