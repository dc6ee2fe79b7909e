"""Build the API reference with pdoc (`make docs`): `docs/api/index.html` and one
page per public module. Any warning pdoc raises (an unresolvable annotation, a
broken link, a module that fails to import) fails the build."""

import os
import sys
import warnings
from pathlib import Path

os.environ.setdefault("MPLBACKEND", "Agg")


# The public surface: `jaxattn` and its public submodules (metrics, theory, sweep, …);
# pdoc's `!` patterns (regular expressions) drop the private `_*` implementation modules,
# and the modules of the two commands above the library (`jaxattn.cli.*`,
# `jaxattn.bench.*`: the benchmark references import torch), whose packages keep a page.
MODULES = ["jaxattn", r"!jaxattn\._.*", r"!jaxattn\.\w+\._.*", r"!jaxattn\.cli\..*",
           r"!jaxattn\.bench\..*"]


def main(out: str = "docs/api") -> int:
    import pdoc
    import pdoc.render

    pdoc.render.configure(docformat="markdown", show_source=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pdoc.pdoc(*MODULES, output_directory=Path(out))
    ours = [w for w in caught if f"{os.sep}pdoc{os.sep}" in w.filename]
    for w in ours:
        print(f"docs: warning: {w.message}", file=sys.stderr)
    pages = sorted(p.relative_to(out).as_posix() for p in Path(out).rglob("*.html"))
    print(f"docs: {len(pages)} pages in {out}/ ({', '.join(pages[:8])}, …)")
    return 1 if ours else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
