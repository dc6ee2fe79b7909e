"""The API reference lists every public name of every namespace, each under its own
anchor (`id="jaxattn.models.load"`), and README.md's links go to the pages they name.

The API pages are built alone here (slow, seconds): the hook's generated API pages (`docs/hooks.py`,
`_api`) with `mkdocs.yml`'s mkdocstrings settings, `mkdocs build --strict` into a
temporary folder (the whole site, gallery included, is built in `test_site.py`)."""

import importlib
import importlib.util
import os
import re
import subprocess
import sys
import types
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
#: Every public namespace `ja.X` (a folder `jaxattn/X/` with a face).
NAMESPACES = sorted(p.parent.name for p in (ROOT / "jaxattn").glob("*/__init__.py")
                    if not p.parent.name.startswith("_") and p.parent.name != "cli")


def _hooks():
    spec = importlib.util.spec_from_file_location("jaxattn_docs_hooks_api", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _public(path: str) -> list[str]:
    """The names a user reaches through `path` (`jaxattn` or `jaxattn.X`): its `__all__`,
    or, for a face without one, every name it binds that is not private; less
    `__version__` and the top level's namespaces (a page each)."""
    module = importlib.import_module(path)
    names = getattr(module, "__all__", None)
    if names is None:  # its own submodules are bound by whatever imported them: not names
        names = [n for n, v in vars(module).items() if not n.startswith("_") and not (
            isinstance(v, types.ModuleType) and v.__name__.startswith(f"{path}."))]
    return [n for n in names if not n.startswith("_") and not (
        path == "jaxattn" and isinstance(getattr(module, n), types.ModuleType))]


def _page(namespace: str | None) -> str:
    return "api/index" if namespace is None else f"api/{namespace}"


class _Ids(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids = set()

    def handle_starttag(self, tag, attrs):
        self.ids |= {value for key, value in attrs if key == "id"}


@pytest.fixture(scope="module")
def api_site(tmp_path_factory):
    """The API pages, as the hook generates them, built with `mkdocs.yml`'s settings."""
    hooks = _hooks()
    hooks._generated.clear()
    hooks._api()
    tmp = tmp_path_factory.mktemp("api")
    docs = tmp / "docs"
    for page, text in hooks._generated.items():
        (docs / page).parent.mkdir(parents=True, exist_ok=True)
        (docs / page).write_text(text, encoding="utf-8")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    plugins = [p for p in config["plugins"] if isinstance(p, dict) and "mkdocstrings" in p]
    python = plugins[0]["mkdocstrings"]["handlers"]["python"]
    python["paths"] = [str(ROOT)]
    python["options"]["extensions"] = [str(ROOT / e) for e in python["options"]["extensions"]]
    config.update(docs_dir=str(docs), site_dir=str(tmp / "site"), plugins=plugins,
                  nav=[{"API": sorted(hooks._generated)}], exclude_docs="")
    for key in ("hooks", "theme"):
        config.pop(key)
    (tmp / "mkdocs.yml").write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    env = dict(os.environ, JAX_PLATFORMS="cpu", NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f",
                           str(tmp / "mkdocs.yml")], cwd=ROOT, env=env, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return tmp / "site"


def test_every_namespace_has_an_api_page():
    hooks = _hooks()
    hooks._generated.clear()
    hooks._api()
    missing = [ns for ns in NAMESPACES if _public(f"jaxattn.{ns}")
               and f"api/{ns}.md" not in hooks._generated]
    assert not missing, f"namespaces with public names but no API page: {missing}"


def test_api_pages_name_every_public_name():
    """Fast: the generated pages tell mkdocstrings every name (a name a face imports
    from a private module is rendered only when named)."""
    hooks = _hooks()
    hooks._generated.clear()
    hooks._api()
    for namespace in [None, *NAMESPACES]:
        path = "jaxattn" if namespace is None else f"jaxattn.{namespace}"
        text = hooks._generated.get(f"{_page(namespace)}.md", "")
        named = set(re.findall(r"^ {8}- (\w+)$", text, re.M))
        named |= set(re.findall(rf'<span id="{re.escape(path)}\.(\w+)"></span>', text))
        missing = [n for n in _public(path) if n not in named]
        assert not missing, f"{_page(namespace)}.md names none of {missing}"


@pytest.mark.slow
@pytest.mark.parametrize("namespace", [None, *NAMESPACES])
def test_api_page_anchors_every_public_name(api_site, namespace):
    path = "jaxattn" if namespace is None else f"jaxattn.{namespace}"
    names = _public(path)
    if not names:
        pytest.skip(f"{path} has no public names")
    page = api_site / f"{_page(namespace)}.html"
    assert page.is_file(), f"no API page for {path}"
    parser = _Ids()
    parser.feed(page.read_text(encoding="utf-8"))
    missing = [n for n in names if f"{path}.{n}" not in parser.ids]
    assert not missing, f"{page.name} has no anchor for {len(missing)} of {len(names)}: {missing}"


def test_readme_links_the_mean_field_equation_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = dict(re.findall(r"\[([^\]]+)\]\(([^)]+)\)", readme))
    assert links.get("mean field") == "docs/meanfield_equation.md", links.get("mean field")
    assert (ROOT / links["mean field"]).is_file()
    assert "ja.meanfield" in (ROOT / links["mean field"]).read_text(encoding="utf-8")
