"""The site's generated pages (a mkdocs hook, `mkdocs.yml: hooks`), made at build time:

- the examples gallery: one page per registered experiment, from its class (title,
  theorem, parameters with defaults and bounds) and its small saved run in
  `tests/data/figures/NAME/` (the command that made it, its figure drawn again by the
  experiment's own `draw`, its verdict by its own `verdict`, and how to animate it);
- the API reference: one page per public namespace (`jaxattn/X/__init__.py`), for
  mkdocstrings, naming every public name (`__all__`, or the face's bindings) so that
  each is rendered under its own anchor (`jaxattn.models.load`);
- the notebooks (`notebooks/*.ipynb`) as pages, and BENCHMARKS.md and ARCHITECTURE.md;
- the nav: `mkdocs.yml`'s, less the pages that do not exist (pages other work adds
  appear once their file does), with the gallery and the API pages filled in.
"""

import importlib
import importlib.util
import json
import logging
import os
import re
import subprocess
import sys
import types
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "tests" / "data" / "figures"
log = logging.getLogger("mkdocs.hooks.jaxattn")

#: The public namespaces documented, in nav order (those present at build time).
NAMESPACES = ("metrics", "theory", "models", "spectral", "explore", "meanfield",
              "experiments", "sweep")
#: Repository files shown as pages: source → (page, title).
ROOT_PAGES = {"BENCHMARKS.md": "further/benchmarks.md",
              "ARCHITECTURE.md": "developer/architecture.md"}
#: Placeholders in `mkdocs.yml`'s nav that the hook fills in.
GALLERY, API, NOTEBOOKS = "examples/index.md", "api/index.md", "notebooks/index.md"

_generated: dict[str, str | bytes] = {}
#: The hash of jaxattn's source, once per build (the gallery cache's key).
_SOURCE = [""]


def _load_gallery():
    spec = importlib.util.spec_from_file_location("jaxattn_docs_gallery",
                                                  Path(__file__).with_name("gallery.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gallery = _load_gallery()


def _registry():
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from jaxattn.experiments import REGISTRY

    return REGISTRY


# --- the gallery ---------------------------------------------------------------------
def _param_rows(experiment) -> list[str]:
    rows = ["| flag | type | default | bound | what |", "|---|---|---|---|---|"]
    for p in experiment.all_params():
        if p.minimum is None:
            bound = ""
        elif p.type is int:
            bound = f"≥ {p.minimum:g}"
        else:
            bound = f"> {p.minimum:g}"
        default = "off" if p.type is bool and not p.default else repr(p.default)
        text = p.help.replace("|", "\\|")
        rows.append(f"| `{p.flag}` | {p.type.__name__} | `{default}` | {bound} | {text} |")
    return rows


def _saved_config(name: str) -> dict | None:
    folder = RUNS / name
    if not (folder / "config.json").is_file() or not (folder / "data.npz").is_file():
        return None
    return json.loads((folder / "config.json").read_text(encoding="utf-8"))


def _command(name: str, config: dict, experiment) -> str:
    """The `jaxattn run` command of a saved run: its seed and the parameters it set
    away from their defaults (a saved run older than a parameter has it at its
    default)."""
    parts = ["jaxattn", "run", name, "--seed", str(config.get("seed", 0))]
    for p in experiment.all_params():
        if p.name not in config:
            continue
        value = config[p.name]
        if p.type is bool:
            parts += [p.flag] if value else []
        elif value != p.default:
            parts += [p.flag, repr(value) if p.type is float else str(value)]
    return " ".join(parts)



#: The full-size figures kept under another name than the experiment's: the file, the
#: flags of the run that drew it, and the usage page that discusses it.
FULL_SIZE = {
    "adversarial-tokens": ("explore_adversarial_tokens.png", "", "explore.md"),
    "adversarial-weights": ("explore_adversarial_weights.png", "", "explore.md"),
    "conjecture-bipartite": ("explore_conjecture_bipartite.png", "", "explore.md"),
    "conjecture-multihead": ("explore_conjecture_multihead.png", "", "explore.md"),
    "power-layers": ("power_layers_minilm.png", "--minilm", "spectral.md"),
    "steer": ("spectral_steer_minilm.png", "--minilm", "spectral.md"),
    "oja-bipartite": ("spectral_oja_bipartite.png", "", "spectral.md"),
    "loop-grid": ("", "", "models.md"),  # its figures are per model: none at full size
}

def _gallery_page(name: str, entry, experiment, index: int) -> str:
    from jaxattn._artifacts.trajectories import SAVES_TOKENS, how_to_save

    doc = (type(experiment).__doc__ or "").strip()
    lines = [f"# {entry.title}", "",
             f"`jaxattn run {name}` · checks: {entry.theorem}"
             + (" · sweepable (`jaxattn sweep " + name + "`)" if entry.sweepable else ""),
             ""]
    if doc:
        lines += [doc, ""]
    lines += ["## Parameters", "",
              f"`jaxattn run {name} --help` lists them too; every run also takes `--seed S` "
              "and `--out DIR`.", ""]
    lines += _param_rows(experiment) + [""]
    config = _saved_config(name)
    if config is None:
        lines += ["## A saved run", "", "No small saved run of this experiment is kept "
                  "in `tests/data/figures/`.", ""]
        return "\n".join(lines)
    command = config.get("command") or _command(name, config, experiment)
    lines += ["## A small run", "",
              "The small run kept in `tests/data/figures/" + name + "/` (the sizes the "
              "figure tests draw), made by:", "", "```bash", command, "```", ""]
    cached = gallery.entry(name, _SOURCE[0])
    drawn = json.loads((cached / "verdict.json").read_text(encoding="utf-8"))
    for k, figure in enumerate(drawn["figures"]):
        _generated[f"examples/figures/{name}-{k}.png"] = (cached / figure).read_bytes()
        lines += [f"![{entry.title}](figures/{name}-{k}.png)", ""]
    lines += ["Its verdict, from the saved data (`summary.json` of a run holds the same):",
              "", "```{.text .verdict}", _verdict_word(experiment, drawn["ok"]) + drawn["line"],
              "```", ""]
    figure, flags, page = FULL_SIZE.get(name, (f"{name.replace('-', '_')}.png", "",
                                               "experiments.md"))
    if not drawn["ok"] and name not in gallery.NO_NUMBERS and experiment.judges:
        lines += ["At the figure test's sizes the verdict does not hold; it is shown as the "
                  f"run prints it. [The usage page](../usage/{page}) discusses the runs at "
                  "full size.", ""]
    full = ROOT / "docs" / "figures" / figure
    if full.is_file():
        run = f"jaxattn run {name}" + (f" {flags}" if flags else "")
        lines += ["## At full size", "",
                  f"`{run}` at its defaults (the results are discussed in "
                  f"[the paper's simulations](../usage/{page})):", "",
                  f"![{name} at full size](../figures/{full.name})", ""]
    lines += ["## Animate it", ""]
    if name in SAVES_TOKENS:
        lines += [f"A run folder of `{name}` saves token trajectories ({SAVES_TOKENS[name]}):",
                  "", "```bash", f"jaxattn animate runs/{name}/<timestamp> --out {name}.mp4",
                  f"jaxattn view runs/{name}/<timestamp> --out {name}.html", "```", "",
                  "See [animations](../usage/animations.md).", ""]
    else:
        advice = how_to_save(RUNS / name).replace("{", "").replace("}", "")
        lines += [advice[0].upper() + advice[1:], ""]
    return "\n".join(lines)


def _draw_missing(names) -> None:
    """Draw the gallery's figures that the cache lacks, in two processes."""
    missing = [n for n in names if gallery.entry(n, _SOURCE[0]) is not None
               and not gallery.entry(n, _SOURCE[0]).is_dir()]
    if not missing:
        return
    log.info("gallery: drawing %d experiments' figures (%s)", len(missing), ", ".join(missing))
    gallery.CACHE.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, MPLBACKEND="Agg", JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
    procs = [subprocess.Popen([sys.executable, str(ROOT / "docs" / "gallery.py"), *missing[k::2]],
                              cwd=ROOT, env=env) for k in range(min(2, len(missing)))]
    if any(p.wait() != 0 for p in procs):
        raise RuntimeError("drawing the gallery's figures failed (see above)")


def _gallery() -> list[dict]:
    registry = _registry()
    from jaxattn.experiments import EXPERIMENTS

    _SOURCE[0] = gallery._source_hash()
    _draw_missing(list(registry))
    nav, index = [], ["# Examples", "",
                      "One page per experiment of `jaxattn list`, generated from the "
                      "experiment's own class when the site is built: what it checks, its "
                      "parameters, the command of a small run with its figure and verdict, "
                      "and how to animate it.", "",
                      "| experiment | checks | title |", "|---|---|---|"]
    for i, (name, entry) in enumerate(registry.items()):
        _generated[f"examples/{name}.md"] = _gallery_page(name, entry, EXPERIMENTS[name], i)
        nav.append({name: f"examples/{name}.md"})
        index.append(f"| [{name}]({name}.md) | {entry.theorem} | {entry.title} |")
    _generated[GALLERY] = "\n".join(index) + "\n"
    return [{"Gallery": GALLERY}] + nav


# --- the API reference ---------------------------------------------------------------
def _api() -> list[dict]:
    from jaxattn._lazy import lazy_names

    # the face's names are imported on first use: mkdocstrings is told them by name
    names = [name for name, (_, attribute) in lazy_names(ROOT / "jaxattn" / "__init__.py").items()
             if attribute is not None]
    nav = [{"jaxattn": API}]
    _generated[API] = ("# `jaxattn`\n\nThe top-level names: `import jaxattn as ja`; the "
                       "namespaces `ja.X` have a page each.\n\n"
                       "::: jaxattn\n    options:\n      show_submodules: false\n"
                       "      members:\n" + "".join(f"        - {n}\n" for n in names))
    for ns in NAMESPACES:
        if (ROOT / "jaxattn" / ns / "__init__.py").is_file():
            page = f"api/{ns}.md"
            names, aliases = _public(ns)
            notes = "".join(f'<span id="jaxattn.{ns}.{a}"></span>`ja.{ns}.{a}` is '
                            f"`ja.{ns}.{n}` under a short name.\n\n"
                            for a, n in aliases.items())
            _generated[page] = (f"# `ja.{ns}`\n\n{notes}::: jaxattn.{ns}\n    options:\n"
                                "      show_submodules: true\n      members:\n"
                                + "".join(f"        - {n}\n" for n in names))
            nav.append({f"ja.{ns}": page})
    return nav


def _public(ns: str) -> tuple[list[str], dict[str, str]]:
    """The public names of `jaxattn.<ns>`, for mkdocstrings to render each under its
    own anchor (a name a face imports from a private module is rendered only when
    named): its `__all__`, or, for a face without one, the names it binds that are not
    private. A second name of a module already listed (`experiments.paper` for
    `paper001`) is returned apart, `{alias: name}`, to be noted, not rendered twice."""
    module = importlib.import_module(f"jaxattn.{ns}")
    names = getattr(module, "__all__", None)
    if names is None:  # its own submodules are bound by whatever imported them: not names
        names = [n for n, v in vars(module).items() if not n.startswith("_") and not (
            isinstance(v, types.ModuleType) and v.__name__.startswith(f"{module.__name__}."))]
    values = {n: getattr(module, n) for n in names if not n.startswith("_")}
    aliases = {n: v.__name__.rpartition(".")[2] for n, v in values.items()
               if isinstance(v, types.ModuleType) and v.__name__.rpartition(".")[2] != n
               and values.get(v.__name__.rpartition(".")[2]) is v}
    return [n for n in values if n not in aliases], aliases


# --- notebooks and repository pages --------------------------------------------------
def _notebooks() -> list[dict]:
    nav = [{"Notebooks": NOTEBOOKS}]
    index = ["# Notebooks", "",
             "The notebooks of `notebooks/` (jupytext `.py` paired with `.ipynb`), shown "
             "here without their outputs: run them with Jupyter "
             "(`tests/docs/test_notebooks.py` executes all of them at a small size).", ""]
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        parts = []
        for cell in nb["cells"]:
            source = "".join(cell["source"])
            if cell["cell_type"] == "markdown":
                parts.append(source)
            elif cell["cell_type"] == "code" and source.strip():
                parts.append(f"```python\n{source}\n```")
        text = "\n\n".join(parts)
        if not text.lstrip().startswith("# "):
            text = f"# {path.stem}\n\n{text}"
        title = text.lstrip().splitlines()[0][2:].strip().replace("`", "")  # nav: plain
        page = f"notebooks/{path.stem}.md"
        _generated[page] = (text + f"\n\n---\n\nThe notebook: `notebooks/{path.name}`.\n")
        nav.append({title: page})
        index.append(f"- [{title}]({path.stem}.md)")
    _generated[NOTEBOOKS] = "\n".join(index) + "\n"
    return nav


_LINKS = re.compile(r"(!?)\[([^\]]*)\]\((?!https?:|#)([^)#]+)(#[^)]*)?\)")


def _root_page(source: str, page: str) -> str:
    """A repository markdown file as a site page: links to `docs/…` made relative to
    the page, to the other repository pages made site links, and to any other
    repository file made its name in code (it is no page of the site)."""
    text = (ROOT / source).read_text(encoding="utf-8")
    up = "../" * page.count("/")

    def fix(match):
        bang, label, target, anchor = match.groups()
        anchor = anchor or ""
        if target.startswith("docs/"):
            return f"{bang}[{label}]({up}{target[5:]}{anchor})"
        if target in ROOT_PAGES:
            return f"{bang}[{label}]({up}{ROOT_PAGES[target]}{anchor})"
        return f"{label} (`{target}`)"

    return _LINKS.sub(fix, text)


# --- mkdocs events -------------------------------------------------------------------
def _fill(nav, docs_dir: Path, fills: dict[str, list]) -> list:
    """The nav with the placeholders filled and the pages that do not exist dropped."""
    out = []
    for item in nav:
        if isinstance(item, str):
            item = {None: item}
        ((title, value),) = item.items()
        if isinstance(value, list):
            inner = _fill(value, docs_dir, fills)
            if inner:
                out.append({title: inner})
        elif value in fills:
            out.append({title or value: fills[value]})
        elif value in _generated or (docs_dir / value).is_file() or "://" in value:
            out.append(value if title is None else {title: value})
        else:
            log.info("nav: %s does not exist (yet); left out", value)
    return out


def on_config(config):
    _generated.clear()
    fills = {GALLERY: _gallery(), API: _api(), NOTEBOOKS: _notebooks()}
    for source, page in ROOT_PAGES.items():
        _generated[page] = _root_page(source, page)
    docs_dir = Path(config["docs_dir"])
    config["nav"] = _fill(config["nav"], docs_dir, fills)
    extra = _unlisted(config["nav"], docs_dir)
    if extra:  # a page written since the nav was: shown, not lost
        config["nav"].append({"More": extra})
    return config


def _listed(nav) -> set[str]:
    out = set()
    for item in nav:
        value = item if isinstance(item, str) else next(iter(item.values()))
        out |= _listed(value) if isinstance(value, list) else {value}
    return out


def _unlisted(nav, docs_dir: Path) -> list[dict]:
    """The pages of `docs_dir` that the nav does not list, by their first heading."""
    listed, extra = _listed(nav), []
    for path in sorted(docs_dir.rglob("*.md")):
        page = path.relative_to(docs_dir).as_posix()
        if page in listed:
            continue
        heading = next((ln[2:].strip() for ln in path.read_text(encoding="utf-8").splitlines()
                        if ln.startswith("# ")), path.stem)
        log.info("nav: %s is in no section of mkdocs.yml; listed under More", page)
        extra.append({heading.strip("`"): page})
    return extra


def on_files(files, config):
    for path, content in _generated.items():
        if files.get_file_from_path(path) is not None:
            files.remove(files.get_file_from_path(path))
        files.append(File.generated(config, path, content=content))
    return files


#: A page named as a path in code, `docs/noise.md`: made a link to that page.
_DOC_PATH = re.compile(r"(?<!\[)`docs/([A-Za-z0-9_/.-]+\.md)`(?!\])")


#: An image not inside a link: `![alt](figures/x.png)`.
_IMAGE = re.compile(r"(?<!\[)!\[([^\]]*)\]\(([^)\s]+)\)(?!\]\()")


def on_page_markdown(markdown, page, config, files):
    """Every `` `docs/X.md` `` a page names (outside code blocks) links to that page,
    and every figure to its full-size image (a wide one is scaled to the column)."""
    here = os.path.dirname(page.file.src_uri)

    def link(m):
        if files.get_file_from_path(m.group(1)) is None:
            return m.group(0)
        return f"[{m.group(0)}]({os.path.relpath(m.group(1), here or '.')})"

    def linked(part):
        return _IMAGE.sub(lambda m: f"[{m.group(0)}]({m.group(2)})", _DOC_PATH.sub(link, part))

    parts = re.split(r"(^```.*?^```)", markdown, flags=re.S | re.M)  # fences kept as they are
    return "".join(part if k % 2 else linked(part) for k, part in enumerate(parts))


def _verdict_word(experiment, ok: bool) -> str:
    """"ok: "/"NOT ok: " before a saved run's verdict; nothing for a run too small to
    judge, nor for a study that judges nothing (`judges`)."""
    if experiment.name in gallery.NO_NUMBERS or not experiment.judges:
        return ""
    return "ok: " if ok else "NOT ok: "
