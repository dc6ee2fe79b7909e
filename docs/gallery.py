"""The gallery's figures and verdicts, drawn from the small saved runs of
`tests/data/figures/NAME/` by each experiment's own `draw` and `verdict`, into a
cache that the site's hook (`docs/hooks.py`) reads: `.docs-cache/gallery/KEY/`, where
`KEY` hashes the saved run and the source that draws and judges it (`DRAWN_BY`),
so a change to either draws again.

`python docs/gallery.py NAME …` draws the named experiments (the hook runs two such
processes side by side: drawing them all takes minutes on one core).
"""

import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "tests" / "data" / "figures"
CACHE = ROOT / ".docs-cache" / "gallery"


#: What draws and judges a saved run: the experiments, the figures' style, and the
#: library parts verdicts read (a change elsewhere does not draw the gallery again).
DRAWN_BY = ("experiments", "_artifacts", "metrics", "theory", "spectral")


#: Saved runs too small for their verdict's numbers (`nan ± nan`, `2.71 ± 15`): the
#: page prints none, only what the run is and the command whose run has them.
NO_NUMBERS = {"noisy-transition": "jaxattn run noisy-transition --full"}


def _source_hash() -> str:
    digest = hashlib.sha256()
    paths = [p for part in DRAWN_BY for p in (ROOT / "jaxattn" / part).rglob("*.py")]
    for path in sorted(paths):
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def entry(name: str, source: str | None = None) -> Path | None:
    """The cache folder of `name`'s saved run (`None`: the experiment has none)."""
    folder = RUNS / name
    if not (folder / "config.json").is_file() or not (folder / "data.npz").is_file():
        return None
    digest = hashlib.sha256((source or _source_hash()).encode())
    digest.update((folder / "config.json").read_bytes())
    digest.update((folder / "data.npz").read_bytes())
    return CACHE / f"{name}-{digest.hexdigest()[:20]}"


def draw(name: str, source: str) -> Path:
    """Draw `name`'s figures and judge its verdict into its cache folder."""
    import numpy as np

    from jaxattn.experiments import EXPERIMENTS

    out = entry(name, source)
    experiment = EXPERIMENTS[name]
    saved = json.loads((RUNS / name / "config.json").read_text(encoding="utf-8"))
    config = experiment.config(saved)  # the experiment's Config
    with np.load(RUNS / name / "data.npz") as f:
        data = {k: f[k] for k in f.files}
    tmp = Path(tempfile.mkdtemp(dir=CACHE, prefix=f".{name}-"))
    pngs = [p for p in experiment.draw(config, data, tmp) if p.suffix == ".png"]
    for p in tmp.iterdir():
        if p not in pngs:
            p.unlink()
    verdict = experiment.verdict(config, data)
    line = verdict.line if name not in NO_NUMBERS else (
        "this small run checks the code, not the science: too small for the estimates, "
        f"so none are printed; `{NO_NUMBERS[name]}` makes them")
    (tmp / "verdict.json").write_text(json.dumps(
        {"ok": bool(verdict.ok), "line": line, "figures": [p.name for p in pngs]}))
    try:
        tmp.rename(out)  # whole or not at all
    except OSError:  # another build (a second test worker) drew the same entry first
        if not (out / "verdict.json").is_file():
            raise
        shutil.rmtree(tmp)
    return out


if __name__ == "__main__":
    CACHE.mkdir(parents=True, exist_ok=True)
    source = _source_hash()
    for name in sys.argv[1:]:
        if not entry(name, source).is_dir():
            draw(name, source)
