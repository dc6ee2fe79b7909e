"""`jaxattn loop`: run a real transformer far past its depth (paper 001 §6.2);
`--grid` runs the `loop-grid` experiment on the model instead."""

import argparse

import numpy as np

from ..experiments import declared
from ._common import CLIError, count_checks, loaded_ahead, refuse_first
from .experiments import verdict_status

# Read from the source: `jaxattn loop --help` and its argument errors answer without
# loading JAX (the modules that hold them import it).
PRECISIONS = declared("jaxattn._precision", "PRECISIONS")
DTYPES = declared("jaxattn.experiments.loop_grid", "DTYPES", keys=True)
TOKENS = declared("jaxattn.experiments.loop_runner", "TOKENS")
WEIGHTS = declared("jaxattn.models._loop", "WEIGHTS")
MODELS = declared("jaxattn.models._presets", "PRESETS", keys=True)
PACKAGED = declared("jaxattn.models._packaged", "PACKAGED", keys=True)

#: Flags of a single loop that `--grid` does not take (it runs every weight kind, with
#: and without FFN, in one go).
NOT_GRID = {"resume": "--resume", "text": "--text", "save_states": "--save-states",
            "pad": "--pad", "weights": "--weights", "no_ffn": "--no-ffn",
            "chunk_passes": "--chunk-passes"}


def _depths(text: str) -> list[int]:
    try:
        depths = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        depths = []
    if not depths:  # "" saved nothing, silently
        raise argparse.ArgumentTypeError(
            f"--save-states takes comma-separated depths like 0,12,240; got {text!r}.")
    return depths


def _grid(args: argparse.Namespace) -> int:
    from .._artifacts.folders import read_json
    from ..experiments import run_loop_grid
    from ..experiments.loop_grid import grid_weights

    tokens = TOKENS if args.tokens is None else args.tokens
    weights = grid_weights(args.model)
    if "trained" not in weights:
        print(f"{args.model} is a config, with no trained weights to load: the grid loops "
              "random and resampled weights (for trained ones, give a model folder, a "
              ".gguf file or a packaged model's name)")
    folder = run_loop_grid(args.model, args.out, args.seed, passes=args.passes,
                           prompts=args.prompts, tokens=tokens, dtype=args.dtype,
                           weights=weights, precision=args.precision,
                           progress=not args.no_progress)
    s = read_json(folder / "summary.json")
    for name, v in s.items():
        if isinstance(v, dict) and "E_input_mean" in v:
            print(f"{name:>14}: mean E {_e(v['E_input_mean'])} → {_e(v['E_final_mean'])}")
    status, why = verdict_status(s)
    print(f"verdict{why}: {s['verdict']}")
    print(f"wrote {folder}")
    return status


def _e(value, floor: float = 0.0) -> str:
    """A summary number as printed; `null` in summary.json (NaN/inf) reads "not finite",
    and one below `floor` (the resolution of E in the loop's dtype, where the figure
    stops drawing it) says so."""
    if value is None:
        return "not finite"
    return f"{value:.3e}" + (f" (rounding noise, under {floor:.1e})" if value < floor else "")


def _loop(args: argparse.Namespace) -> int:
    # Checked before JAX loads (as `run` checks its overrides): a bad value answers at
    # once, not after the seconds JAX takes to start.
    single = [flag for name, flag in NOT_GRID.items()
              if getattr(args, name) is not None and getattr(args, name) is not False]
    refuse_first([
        *count_checks(args, {"--passes": 1, "--prompts": 1, "--tokens": 1, "--chunk-passes": 1}),
        (args.grid and single,
         f"{next(iter(single), '')} applies to a single loop, not to --grid (it runs every "
         "weight kind with and without FFN)."),
    ])
    args.weights = args.weights or "trained"
    if args.grid:
        return _grid(args)
    from .._artifacts.figures import resolution
    from .._artifacts.folders import read_json
    from ..experiments.loop_grid import passes

    try:  # the programs of its last run loaded while it imports and starts
        with loaded_ahead("loop", args):
            from ..experiments import run_loop

            folder = run_loop(
                args.model, args.out, args.seed, weights=args.weights, passes=args.passes,
                ffn=not args.no_ffn, prompts=args.prompts, tokens=args.tokens,
                dtype=args.dtype, save_states=args.save_states, precision=args.precision,
                text=args.text, pad=args.pad, resume=args.resume,
                progress=not args.no_progress,
                **({} if args.chunk_passes is None else {"chunk_passes": args.chunk_passes}),
            )
    except ImportError as e:  # an optional package (tokenizers for --text)
        raise CLIError(str(e)) from None
    s = read_json(folder / "summary.json")
    cfg = read_json(folder / "config.json")
    print(f"jaxattn loop: {args.model}, {args.weights} weights, "
          f"{'no FFN' if args.no_ffn else 'full blocks'}, {passes(args.passes)} of "
          f"{s['layers_per_pass']} blocks, {cfg['prompts']}×{cfg['tokens']} tokens")
    with np.load(folder / "data.npz") as data:  # E's dtype: where the figure stops
        floor = resolution(data["E"].dtype) if data["E"].dtype.kind == "f" else 0.0
    print(f"mean E: input {_e(s['E_input_mean'])}, after pass 1 "
          f"{_e(s['E_after_pass_1_mean'], floor)}, final {_e(s['E_final_mean'], floor)}  "
          f"({s['seconds']:.1f} s)")
    if args.text is not None:
        _kept(args.model, folder)
    print(f"wrote {folder}")
    return 0


def _kept(model: str, folder) -> None:
    """Print the first prompt as looped (cut or padded), and how to see them all."""
    from ..models import detokenize

    with np.load(folder / "data.npz") as data:
        ids = data["ids"]
    text = " ".join(detokenize(model, ids[0]).split())
    text = text if len(text) <= 70 else text[:69] + "…"
    print(f"prompt 0 as looped: {text!r}  (all: ja.models.detokenize({model!r}, "
          f"np.load('{folder}/data.npz')['ids']))")


def _pad(text: str):
    if text == "auto":
        return text
    try:
        pad = int(text)
    except ValueError:
        pad = -1
    if pad < 0:
        raise argparse.ArgumentTypeError(f"--pad takes a token id ≥ 0 (or no value: the "
                                         f"tokenizer's padding token); got {text!r}.")
    return pad


def register(sub) -> None:
    p = sub.add_parser(
        "loop", help="loop a real transformer (GPT-2, GPT-Neo, BERT, ALBERT, Llama) "
        "and record the misalignment E after every block",
        description="Feed token ids through a model again and again (the output of a "
        "pass, after the final norm, is the input of the next) and record E (paper 001 "
        "eq. 25) after every block, streamed to the run folder in chunks: a killed run "
        "continues with the same command and --resume. Writes a run folder with the "
        "figure.")
    p.add_argument("--model", required=True, help="(required) a model folder, a .gguf "
                   f"file, a hub name, a packaged model ({', '.join(PACKAGED)}: pip "
                   "packages, offline), or for random weights a config.json or a preset "
                   f"({', '.join(MODELS)})")
    p.add_argument("--weights", choices=WEIGHTS, default=None,
                   help="the model's own weights, one random draw, or a fresh draw before "
                   "every pass (default: trained)")
    p.add_argument("--passes", type=int, default=20,
                   help="passes through the whole model (default: %(default)s)")
    p.add_argument("--no-ffn", action="store_true",
                   help="pure self-attention: drop each block's feed-forward sub-block "
                   "(default: off, full blocks)")
    p.add_argument("--prompts", type=int, default=100,
                   help="random prompts, ids drawn uniformly from the vocabulary; ignored "
                   "with --text (default: %(default)s)")
    p.add_argument("--tokens", type=int, default=None,
                   help=f"tokens per prompt; with --text every prompt is cut to this "
                   "length, and a shorter one is refused unless --pad (default: "
                   f"{TOKENS} random ids; with --text the shortest prompt's length, with "
                   "--pad the longest's)")
    p.add_argument("--text", default=None, metavar="FILE",
                   help="prompts from a text file, one per line, tokenized with the "
                   "model's own tokenizer; the ids looped are saved in data.npz, "
                   "ja.models.detokenize shows their text (default: none, random ids)")
    p.add_argument("--pad", nargs="?", const="auto", default=None, type=_pad,
                   metavar="ID", help="with --text, pad prompts shorter than --tokens "
                   "with token ID (no ID: the tokenizer's own padding token). The padding "
                   "is masked: no token attends to it, and E counts the text tokens only "
                   "(data.npz keeps the mask) (default: no padding, prompts cut to the "
                   "shortest one's length, the words cut said)")
    p.add_argument("--dtype", choices=list(DTYPES), default="float32",
                   help="compute dtype (default: %(default)s)")
    p.add_argument("--precision", choices=list(PRECISIONS), default="float32",
                   help="of every matrix product: true float32 on every backend, "
                   "tensorfloat32, or bfloat16 operands with float32 sums "
                   "(default: %(default)s)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the random prompts and weights (default: %(default)s)")
    p.add_argument("--save-states", type=_depths, default=None, metavar="D1,D2,…",
                   help="also save the hidden states at these depths, 0 = embeddings "
                   "(default: none)")
    p.add_argument("--grid", action="store_true", help="every weight kind with and without "
                   "FFN in one run folder and figure, as `jaxattn run loop-grid` "
                   "(default: off)")
    p.add_argument("--out", default=None,
                   help="run folder (default: runs/loop/<time>)")
    p.add_argument("--resume", action="store_true",
                   help="continue the loop in --out from its last saved chunk, to the same "
                   "result as an uninterrupted run; its settings must be the same "
                   "(default: off)")
    p.add_argument("--chunk-passes", type=int, default=None, metavar="K",
                   help="save E and the hidden state every K passes: what a kill can "
                   "lose (default: 10)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (default: a bar with the time left)")
    p.set_defaults(func=_loop)
