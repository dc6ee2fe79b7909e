"""The costs a new user meets are on the pages where they meet them (issue: the
undocumented `make docs` time, SmolLM2's loading time, `run_layers`' default τ = 1)."""

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.mark.parametrize("page, pattern", [
    ("install.md", r"`make docs` takes minutes \(about \d+"),
    ("usage/models.md", r"Loading SmolLM2-135M takes .*\(\d+ s on"),
    ("usage/model.md", r"without `tau` takes \*\*τ = 1\*\*"),
])
def test_a_cost_is_said_where_it_is_met(page, pattern):
    text = " ".join((DOCS / page).read_text(encoding="utf-8").split())
    assert re.search(pattern, text), f"{page} does not say {pattern!r}"
