"""`jaxattn animate DIR`: a run folder's token trajectory as a movie (MP4 or GIF)."""

import argparse
from pathlib import Path

from ._common import CLIError, count_checks, file_refusals, refuse_first


def _animate(args: argparse.Namespace) -> int:
    out = Path(args.out) if args.out else None  # the default is named after the trajectory
    folder = out.parent if out else None
    refuse_first([
        *count_checks(args, {"--fps": 1, "--frames": 1, "--trail": 0, "--dpi": 20}),
        (args.dpi > 1000, f"--dpi must be at most 1000 (a frame of 6400 × 7200 pixels), "
         f"got {args.dpi}."),
        (out is not None and out.suffix.lower() == ".gif" and args.fps > 50,
         f"a GIF plays at most 50 fps (its frames last whole hundredths of a second, and "
         f"browsers slow shorter ones to 0.1 s), got --fps {args.fps}: lower it, or write "
         "an .mp4."),
        (out is not None and out.suffix.lower() not in (".mp4", ".gif"),
         f"--out must end in .mp4 or .gif, got {args.out!r}."),
        (not abs(args.spin) < 1e6, f"--spin must be a finite number of degrees, got {args.spin}."),
        (args.until is not None and not args.until > 0, f"--until must be > 0, got {args.until}."),
        *(file_refusals(out, "movie.mp4") if out is not None else ()),
    ])
    from .._artifacts.animate import animate, gif_fps
    from .._artifacts.folders import check_not_held
    from .._artifacts.trajectories import load, tokens_title

    if folder is not None:  # not into a folder a running command is writing
        check_not_held(folder, writing=True)

    track = load(args.folder, args.which, args.index)
    if track.note:
        print(f"jaxattn animate: {track.name}: {track.note}")
    xs, ts, E = track.xs, track.ts, track.E
    if args.until is not None:
        keep = ts <= args.until
        if keep.sum() < 2:
            raise CLIError(f"--until {args.until:g} keeps fewer than 2 saves (the run starts "
                           f"at {ts[0]:g}).")
        xs, ts, E = xs[keep], ts[keep], None if E is None else E[keep]
    out = out or Path(args.folder) / f"{track.name.replace('[', '_').rstrip(']')}.mp4"
    n, d = xs.shape[1:]
    print(f"jaxattn animate: {track.name}, {xs.shape[0]} saves: {tokens_title(xs)}"
          + (" (PCA to 3 dimensions)" if d > 3 else ""))
    path = animate(xs, out, ts, E=E, title=args.title or track.title, layers=track.layers,
                   fps=args.fps, frames=args.frames, trail=args.trail, dpi=args.dpi, spin=args.spin,
                   progress=not args.no_progress)
    played = gif_fps(args.fps) if path.suffix.lower() == ".gif" else args.fps
    print(f"wrote {path}" + (f" (it plays at {played:.3g} fps: a GIF's frames last whole "
                             "hundredths of a second)" if played != args.fps else ""))
    return 0


def register(sub) -> None:
    p = sub.add_parser("animate",
                       help="a run folder's token trajectories as a movie (MP4 or GIF)",
                       description="Draw the token trajectory saved in a run folder's "
                       "data.npz (`jaxattn run`, `jaxattn loop "
                       "--save-states`) as a movie: S² as a shaded sphere with trails, S¹ "
                       "as a circle, d > 3 by one PCA; "
                       "E(t) under it.")
    p.add_argument("folder", help="a run folder (with data.npz)")
    p.add_argument("--out", help="the movie, .mp4 or .gif (default: DIR/<trajectory>.mp4)")
    p.add_argument("--which", help="the trajectory's array in data.npz (default: the first: "
                   "ys, ys_layers, …)")
    p.add_argument("--index", type=int, default=0,
                   help="which run of a batch of runs (B, T, n, d), or prompt of a loop "
                   "(default 0)")
    p.add_argument("--frames", type=int, default=200, help="most frames (default 200)")
    p.add_argument("--fps", type=int, default=20, help="frames per second (default 20)")
    p.add_argument("--trail", type=int, default=8, help="frames of trail (default 8)")
    p.add_argument("--spin", type=float, default=60.0,
                   help="degrees the sphere turns over the movie (default 60)")
    p.add_argument("--until", type=float, help="only the saves up to this time or layer")
    p.add_argument("--dpi", type=int, default=100,
                   help="pixels per inch of the 6.4 × 7.2 in frame (default 100)")
    p.add_argument("--title", help="the line over the picture")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_animate)
