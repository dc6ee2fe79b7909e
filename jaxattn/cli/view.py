"""`jaxattn view DIR --out FILE.html`: a run folder's tokens as one page to turn and scrub."""

import argparse
from pathlib import Path

from ._common import file_refusals, refuse_first


def _view(args: argparse.Namespace) -> int:
    out = Path(args.out)
    refuse_first([
        (out.suffix.lower() not in (".html", ".htm"),
         f"--out must end in .html, got {args.out!r}."),
        *file_refusals(out, "page.html"),
    ])
    from .._artifacts.folders import check_not_held
    from .._artifacts.trajectories import load, tokens_title
    from .._artifacts.view import write_view

    check_not_held(out.parent, writing=True)  # not into a folder a running command writes

    track = load(args.folder, args.which, args.index)
    if track.note:
        print(f"jaxattn view: {track.name}: {track.note}")
    path = write_view(out, track.xs, track.ts, E=track.E, title=args.title or track.title,
                      layers=track.layers)
    print(f"jaxattn view: {track.name}, {track.xs.shape[0]} saves: "
          f"{tokens_title(track.xs)}")
    print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB; open it in a browser, "
          "no network needed)")
    return 0


def register(sub) -> None:
    p = sub.add_parser("view",
                       help="a run folder's token trajectories as one HTML page to turn "
                       "and scrub",
                       description="Write the token trajectory saved in a run folder's "
                       "data.npz as one self-contained HTML page: drag to turn the sphere, "
                       "a slider scrubs the time, E(t) under it.")
    p.add_argument("folder", help="a run folder (with data.npz)")
    p.add_argument("--out", required=True, help="the page to write, FILE.html")
    p.add_argument("--which", help="the trajectory's array in data.npz (default: the first)")
    p.add_argument("--index", type=int, default=0,
                   help="which run of a batch of runs (B, T, n, d), or prompt of a loop "
                   "(default 0)")
    p.add_argument("--title", help="the page's title")
    p.set_defaults(func=_view)
