"""The documentation site as a reader gets it: `mkdocs build --strict` (every warning
an error) into a temporary folder, then every page opened in headless chromium (the
browser of `tests/artifacts/test_view.py`): no console error and nothing fetched from elsewhere,
every image decoded, every internal link and anchor resolved; the gallery has a page
for every registered experiment; the Python blocks of the site's pages run (those of
README.md and docs/*.md run in `tests/docs/test_docs_run.py`, the notebooks' in
`tests/docs/test_notebooks.py`, the API pages' examples as doctests there too).

Building the site draws every experiment's figure from its saved run (minutes on a
shared CPU): those tests are slow (`make test-slow`, CI). README.md's length and the
nav's tolerance of missing pages are checked in the fast suite."""

import importlib.util
import os
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
from _browser import Browser, need_browser
from test_docs_run import _program, python_blocks

from jaxattn.experiments import REGISTRY

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
#: The pages in folders under docs/ (docs/*.md run in test_docs_run.py).
PAGES = sorted(p for p in DOCS.rglob("*.md") if p.parent != DOCS)


def _hooks():
    spec = importlib.util.spec_from_file_location("jaxattn_docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- fast -----------------------------------------------------------------------------
def test_a_gallery_entry_drawn_twice_keeps_the_first(tmp_path, monkeypatch):
    """Two builds at once (the two test workers) may draw one entry: the second finds
    it in place and drops its own copy, instead of failing on the rename."""
    spec = importlib.util.spec_from_file_location("jaxattn_docs_gallery", DOCS / "gallery.py")
    gallery = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gallery)
    monkeypatch.setattr(gallery, "CACHE", tmp_path)
    first = gallery.draw("phase-diagram", "a source")
    assert gallery.draw("phase-diagram", "a source") == first
    assert (first / "verdict.json").is_file()
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no copy left behind


def test_readme_is_short_and_keeps_its_two_commands():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150, len(lines)
    index = (DOCS / "index.md").read_text().splitlines()
    for command in ("make run ", "make test "):
        line = next(ln for ln in lines if ln.startswith(command))
        assert line in index  # the same line on the site's first page
    assert "![" in (ROOT / "README.md").read_text()  # the moving picture
    assert (ROOT / "docs" / "figures" / "tokens.gif").stat().st_size < 400_000


def test_nav_leaves_out_missing_pages(tmp_path):
    hooks = _hooks()
    (tmp_path / "here.md").write_text("# here\n")
    nav = [{"A": "here.md"}, {"B": "not_yet.md"}, {"C": [{"D": "not_yet.md"}]},
           {"E": [{"F": "here.md"}, "gone.md"]}]
    assert hooks._fill(nav, tmp_path, {}) == [{"A": "here.md"}, {"E": [{"F": "here.md"}]}]


def test_pages_outside_the_nav_are_listed_under_more(tmp_path):
    hooks = _hooks()
    (tmp_path / "here.md").write_text("# Here\n")
    (tmp_path / "new.md").write_text("Intro.\n\n# A new page\n")
    nav = hooks._fill([{"A": "here.md"}], tmp_path, {})
    assert hooks._unlisted(nav, tmp_path) == [{"A new page": "new.md"}]


def test_fenced_doctests():
    from importlib.util import module_from_spec, spec_from_file_location

    spec = spec_from_file_location("griffe_doctests", DOCS / "griffe_doctests.py")
    module = module_from_spec(spec)
    spec.loader.exec_module(module)
    text = "Intro.\n\n>>> 1 + 1\n2\n>>> [1.0, 0.0]\n[1.0, 0.0]\n\nAfter.\n```python\n>>> x\n```"
    assert module.fence_doctests(text) == (
        "Intro.\n\n```pycon\n>>> 1 + 1\n2\n>>> [1.0, 0.0]\n[1.0, 0.0]\n```\n\nAfter.\n"
        "```python\n>>> x\n```")


# --- the built site (slow) ------------------------------------------------------------
@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site built now (or, to look again without rebuilding, the one built at
    `$JAXATTN_SITE`)."""
    if os.environ.get("JAXATTN_SITE"):
        return Path(os.environ["JAXATTN_SITE"]).resolve()
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, MPLBACKEND="Agg", JAX_PLATFORMS="cpu", NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(out)], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


@pytest.fixture(scope="module")
def browser():
    need_browser()
    b = Browser(1200, 900)
    yield b
    b.close()


class _Refs(HTMLParser):
    """Every link, image, script and stylesheet of a page, and every id in it."""

    def __init__(self):
        super().__init__()
        self.refs, self.ids, self.code = [], set(), []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.add(attrs["id"])
        for key in ("href", "src"):
            if attrs.get(key):
                self.refs.append((tag, attrs[key]))
        if tag == "code" or (tag == "div" and "highlight" in (attrs.get("class") or "")):
            self.code.append(attrs.get("class") or "")


def _parse(path: Path) -> _Refs:
    refs = _Refs()
    refs.feed(path.read_text(encoding="utf-8"))
    return refs


def _pages(site) -> list[Path]:
    """The site's pages, less 404.html (a server shows it at any address, so its links
    are absolute from the site's root)."""
    return sorted(p for p in site.rglob("*.html") if p.name != "404.html")


@pytest.mark.slow
def test_gallery_has_a_page_for_every_experiment(site):
    for name, entry in REGISTRY.items():
        page = site / "examples" / f"{name}.html"
        assert page.is_file(), name
        text = page.read_text(encoding="utf-8")
        assert f"jaxattn run {name}" in text
        if not (ROOT / "tests" / "data" / "figures" / name / "data.npz").is_file():
            assert "No small saved run" in text  # test_figures asks for one
            continue
        images = [src for tag, src in _parse(page).refs if tag == "img"]
        assert any(src.startswith("figures/") for src in images), name
        assert "verdict" in text, name


@pytest.mark.slow
def test_every_internal_link_image_and_anchor_resolves(site):
    broken = []
    parsed = {page: _parse(page) for page in _pages(site)}
    for page, refs in parsed.items():
        for tag, ref in refs.refs:
            url = urlparse(ref)
            if url.scheme in ("http", "https", "mailto", "data", "javascript") or url.netloc:
                continue
            target = page if not url.path else (page.parent / unquote(url.path)).resolve()
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{page.relative_to(site)}: {tag} {ref}")
            elif url.fragment and target.suffix == ".html" and target in parsed:
                if unquote(url.fragment) not in parsed[target].ids:
                    broken.append(f"{page.relative_to(site)}: {ref} (no such anchor)")
    assert not broken, "\n".join(broken[:40])


@pytest.mark.slow
def test_every_page_loads_cleanly_in_the_browser(site, browser, tmp_path):
    import numpy as np
    from PIL import Image

    problems = []
    for page in _pages(site):
        errors = browser.open(page.as_uri())
        bad_images = browser.evaluate(
            "Array.from(document.images).filter(i => !(i.complete && i.naturalWidth > 0))"
            ".map(i => i.getAttribute('src'))")
        outside = browser.evaluate(
            "performance.getEntriesByType('resource').map(e => e.name)"
            ".filter(n => !n.startsWith('file:') && !n.startsWith('data:'))")
        name = str(page.relative_to(site))
        problems += [f"{name}: {e}" for e in errors]
        problems += [f"{name}: image not shown: {src}" for src in bad_images]
        problems += [f"{name}: fetched {url}" for url in outside]
    assert not problems, "\n".join(problems[:40])
    browser.open((site / "index.html").as_uri())
    shot = np.asarray(Image.open(browser.screenshot(tmp_path / "index.png")).convert("RGB"))
    assert shot.std() > 20  # the first page shows something


@pytest.mark.slow
def test_every_python_block_on_the_site_comes_from_a_page_that_runs(site):
    """A ```python block on a page of the site is one of its source page's blocks, and
    that page's blocks run (below, in test_docs_run, or the notebooks' test)."""
    for source in sorted(DOCS.rglob("*.md")):
        page = site / source.relative_to(DOCS).with_suffix(".html")
        if not page.is_file():
            continue
        shown = page.read_text(encoding="utf-8").count('class="language-python')
        assert shown == len(python_blocks(source.read_text())), source


@pytest.mark.slow
@pytest.mark.parametrize("path", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
def test_site_page_python_blocks_run(path, tmp_path):
    program, skipped = _program(path)
    print(f"{path.name}: {skipped} block(s) marked no-run")
    if not program:
        pytest.skip(f"{path.relative_to(DOCS)} has no runnable python block")
    env = dict(os.environ, MPLBACKEND="Agg", JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run([sys.executable, "-c", program], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
    marks = [ln for ln in proc.stdout.splitlines() if ln.startswith("--- ")]
    assert proc.returncode == 0, f"{marks[-1:]}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
