"""`jaxattn view DIR --out FILE.html`: one self-contained page, driven in a real
headless chromium (Debian's; `.ci/run` installs it, and these tests skip where it is
missing outside CI): it loads with no console error and fetches nothing, the slider
moves the tokens, dragging turns the sphere, and a screenshot is not blank."""

import re
from pathlib import Path

import numpy as np
import pytest
from _browser import Browser, need_browser

from jaxattn._artifacts.view import view_html
from jaxattn.cli import main

RUNS = Path(__file__).parents[1] / "data" / "figures"


@pytest.fixture(scope="module")
def browser():
    need_browser()
    b = Browser(900, 1000)
    yield b
    b.close()


def _page(tmp_path, run, *extra) -> Path:
    out = tmp_path / f"{run}.html"
    assert main(["view", str(RUNS / run), "--out", str(out), *extra]) == 0
    return out


def test_page_is_self_contained(tmp_path):
    text = _page(tmp_path, "thm41-sphere").read_text()
    # nothing to fetch: no script, stylesheet, image or frame from elsewhere
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)
    assert "<script src" not in text and "@import" not in text


def test_slider_moves_the_tokens_without_console_errors(tmp_path, browser):
    page = _page(tmp_path, "demo")
    assert browser.open(page.as_uri()) == []
    before = browser.evaluate("window.jaxattnView.positions()")
    frames = browser.evaluate("window.jaxattnView.frames")
    # the user's way: the range input moved and its input event fired
    browser.evaluate("""(() => { const s = document.getElementById('time');
        s.value = String(Math.floor(s.max / 3)); s.dispatchEvent(new Event('input')); })()""")
    assert browser.evaluate("window.jaxattnView.frame()") == frames // 3
    after = browser.evaluate("window.jaxattnView.positions()")
    moved = np.linalg.norm(np.array(after)[:, :2] - np.array(before)[:, :2], axis=1)
    assert len(before) == 10 and np.all(moved > 1.0), moved  # every token, in pixels
    label = browser.evaluate("document.getElementById('label').textContent")
    assert label.startswith("t = ") and "E = " in label
    assert browser.errors() == []


def test_a_phone_wide_page_fits_its_canvases(tmp_path):
    """At 400 px the 560 px canvases ran off the right edge."""
    need_browser()
    narrow = Browser(400, 900)
    try:
        assert narrow.open(_page(tmp_path, "thm41-sphere").as_uri()) == []
        widths = narrow.evaluate("""[...document.querySelectorAll('canvas')].map(
            c => c.getBoundingClientRect().right)""")
        inner = narrow.evaluate("window.innerWidth")  # headless chromium: at least 500
        assert inner < 560 and max(widths) <= inner, (widths, inner)
    finally:
        narrow.close()


def test_dragging_turns_the_sphere(tmp_path, browser):
    page = _page(tmp_path, "thm41-sphere")
    assert browser.open(page.as_uri()) == []
    box = browser.evaluate("""(() => { const r = document.getElementById('sphere')
        .getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()""")
    before = np.array(browser.evaluate("window.jaxattnView.positions()"))
    x, y = box
    for kind, dx in (("mousePressed", 0), ("mouseMoved", 40), ("mouseMoved", 80),
                     ("mouseReleased", 80)):
        browser.call("Input.dispatchMouseEvent", type=kind, x=x + dx, y=y, button="left",
                     buttons=0 if kind == "mouseReleased" else 1, clickCount=1)
    after = np.array(browser.evaluate("window.jaxattnView.positions()"))
    assert browser.evaluate("window.jaxattnView.frame()") == 0  # the time did not move
    assert np.abs(after - before).max() > 5.0  # the view did
    # a turn is a rotation: distances from the sphere's centre are kept
    center = np.array([280.0, 280.0])
    np.testing.assert_allclose(np.linalg.norm(after[:, :2] - center, axis=1) ** 2
                               + (after[:, 2] * 0.44 * 560) ** 2,
                               np.linalg.norm(before[:, :2] - center, axis=1) ** 2
                               + (before[:, 2] * 0.44 * 560) ** 2, rtol=1e-3)


def test_screenshot_is_not_blank(tmp_path, browser):
    from PIL import Image

    page = _page(tmp_path, "thm41-sphere")
    assert browser.open(page.as_uri()) == []
    shot = browser.screenshot(tmp_path / "view.png")
    pixels = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    assert pixels.std() > 20  # not one flat colour
    saturated = (pixels.max(-1) - pixels.min(-1)) > 80  # the tokens' colours, E's marker
    assert saturated.sum() > 100


@pytest.mark.slow  # warm: over ~3 s (make test stays the fast loop)
def test_a_page_of_many_saves_loads_and_turns_frames(tmp_path, browser):
    """250,000 saves (2 tokens, the most a page holds): the E curve's bounds are read
    once (a `Math.min(...E)` per point drawn made a frame quadratic in the saves, and
    a spread that long throws), so the page loads with no error and moves."""
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(250_000, 2, 3))
    xs /= np.linalg.norm(xs, axis=-1, keepdims=True)
    E = np.geomspace(1.0, 1e-9, len(xs))
    page = tmp_path / "many.html"
    page.write_text(view_html(xs, E=E))
    assert browser.open(page.as_uri()) == []
    assert browser.evaluate("window.jaxattnView.frames") == 250_000
    browser.evaluate("window.jaxattnView.setFrame(200000)")
    assert browser.evaluate("window.jaxattnView.frame()") == 200_000
    assert browser.errors() == []


@pytest.mark.parametrize("run, extra, dims", [
    ("metastability", ["--index", "1"], "on S¹"),  # the circle, one of three runs
    ("hardmax", ["--which", "ys_nsd"], "in R²"),  # not on the circle
    ("oja-bipartite", [], "on S²"),
])
def test_other_runs_load(tmp_path, browser, run, extra, dims):
    page = _page(tmp_path, run, *extra)
    assert dims in page.read_text()
    assert browser.open(page.as_uri()) == []
    assert browser.evaluate("window.jaxattnView.frames") > 1


def test_pca_pages_say_what_is_kept(tmp_path, browser):
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(12, 6, 5))
    page = tmp_path / "pca.html"
    page.write_text(view_html(xs, np.linspace(0, 1, 12), title="five dimensions"))
    assert browser.open(page.as_uri()) == []
    note = browser.evaluate("document.getElementById('note').textContent")
    assert note.startswith("PCA of the trajectory: 3 of 5 dimensions keep")


@pytest.mark.parametrize("xs, ts, message", [
    (np.ones((4, 3)), None, "must be"),
    (np.full((4, 3, 3), np.inf), None, "NaN or infinite"),
    (np.ones((4, 3, 3)), np.arange(3.0), "one time per save"),
])
def test_bad_input_is_refused(xs, ts, message):
    with pytest.raises(ValueError, match=message):
        view_html(xs, ts)


def test_a_title_is_only_a_title():
    """A title reading `__DATA__` was replaced by the page's data."""
    page = view_html(np.ones((2, 3, 3)) / np.sqrt(3), title="__DATA__ and __HINT__")
    assert "<h1>__DATA__ and __HINT__</h1>" in page or "__DATA__ and __HINT__</" in page
    assert page.count('"xs":') == 1


def test_a_page_says_what_its_picture_is():
    """On the circle no sphere to drag; without times the saves are steps; the title
    names the sphere the tokens are on; E stops at its dtype's resolution."""
    import json

    from jaxattn._artifacts.figures import resolution

    angle = np.linspace(0.0, 1.0, 4)[:, None] * np.arange(1.0, 6.0)
    circle = np.stack([np.cos(angle), np.sin(angle)], -1).astype(np.float32)
    page = view_html(circle)
    data = json.loads(re.search(r"const DATA = (\{.*?\});", page).group(1))
    assert "Drag the sphere" not in page and "tokens on the circle" in page
    assert data["unit"] == "step" and data["dtype"] == "float32"
    assert data["floor"] == resolution(np.float32)
    assert "<h1>5 tokens on S¹</h1>" in page
    sphere = view_html(np.concatenate([circle, np.zeros((4, 5, 1))], -1), np.arange(4.0))
    assert "Drag the sphere" in sphere and '"unit":"t"' in sphere


def test_make_test_says_why_tests_skip():
    """`make test` lists skipped tests with their reason (the view's need chromium,
    which `.ci/run` installs) instead of a bare count."""
    makefile = (Path(__file__).parents[2] / "Makefile").read_text()
    recipe = re.search(r"^test: .*\n\t(.*)$", makefile, re.M).group(1)
    assert re.search(r"\s-r\w*s", recipe), recipe
