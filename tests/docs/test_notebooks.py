"""Every notebook runs top to bottom (nbclient, at the small size its
`JAXATTN_NOTEBOOK_SMALL=1` switch selects), and each `.ipynb` holds the same code
as its jupytext `.py` pair, so neither rots."""

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
jupytext = pytest.importorskip("jupytext")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((Path(__file__).parents[2] / "notebooks").glob("0*.py"))


def _code(nb) -> list[str]:
    return [c.source.strip() for c in nb.cells if c.cell_type == "code"]


def test_the_five_notebooks_exist():
    names = [p.stem for p in NOTEBOOKS]
    assert names == ["01_quickstart", "02_paper_figures", "03_looped_transformers",
                     "04_power_method", "05_adversarial"]


@pytest.mark.slow  # all five in `make test-slow` (the quickstart alone took 16 s warm)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_and_matches_its_pair(path, tmp_path, monkeypatch):
    paired = path.with_suffix(".ipynb")
    assert paired.exists(), f"run: jupytext --to ipynb {path}"
    nb = nbformat.read(paired, as_version=4)
    assert _code(nb) == _code(jupytext.read(path)), f"{paired.name} is out of date: jupytext --sync"
    monkeypatch.setenv("JAXATTN_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any(o.get("output_type") in ("stream", "display_data", "execute_result")
               for o in outputs)
