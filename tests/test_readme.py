"""The README is the front door: the two set-up commands first, under 150 lines, and
every page of reference material it moved out reachable from it."""
from __future__ import annotations

import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def test_the_two_set_up_commands_come_first():
    first_block = re.search(r"```sh\n(.*?)```", README, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first_block.splitlines() if line.strip()]
    assert commands == ["make demo", "make test"]
    assert README.index("make demo") < README.index("## Install")


def test_it_is_short():
    assert len(README.splitlines()) < 150


def test_every_docs_page_is_linked_and_every_link_resolves():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    local = {link for link in links if not link.startswith("http")}
    assert all((REPO / link).exists() for link in local), [link for link in local if not (REPO / link).exists()]
    pages = {f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")}
    assert pages <= local, pages - local
