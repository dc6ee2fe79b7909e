"""Seconds per pass of the looped-model protocol (paper 001 §6.2): jaxattn against
the HuggingFace PyTorch blocks looped by hand, in the same run, on the same weights
(`benchmarks/loop_vs_hf.py` runs it; S4 of the suite too).

Both sides load the same random weights of a config; one pass = every block, `E`
(eq. 25) after every block. "attn" is pure attention (`ln_2` and the MLP removed),
"full" the whole block. HuggingFace runs where JAX does (`device.TorchSide`) and
follows the paper's public script, with the causal mask passed explicitly
(docs/usage/models.md). The JAX program is compiled ahead of time; the two sides are
timed in interleaved pairs: median, min and max per pass, and the largest relative
difference of the two `E` curves. Measurements: BENCHMARKS.md.
"""

import contextlib
import dataclasses
import json
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers as tf
from huggingface_hub import utils as hub_utils

from .. import models as jm
from ..models import default_chunk, loop_program
from .device import TorchSide
from .reference_torch import misalignment
from .timing import Timing

CONFIGS = {
    "gpt2": lambda: tf.GPT2Config(),
    "gpt-neo-125M": lambda: tf.GPTNeoConfig(
        hidden_size=768, num_layers=12, num_heads=12,
        attention_types=[[["global", "local"], 6]], window_size=256,
    ),
    "gpt2-xl": lambda: tf.GPT2Config(n_embd=1600, n_layer=48, n_head=25),
    "gpt-neo-2.7B": lambda: tf.GPTNeoConfig(
        hidden_size=2560, num_layers=32, num_heads=20,
        attention_types=[[["global", "local"], 16]], window_size=256,
    ),
}
CLASSES = {"gpt2": tf.GPT2Model, "gpt-neo-125M": tf.GPTNeoModel,
           "gpt2-xl": tf.GPT2Model, "gpt-neo-2.7B": tf.GPTNeoModel}


@contextlib.contextmanager
def quiet():
    """HuggingFace's logging (errors only) and progress bars (transformers' and the
    hub's tqdm) off, restored after: nothing of theirs mixes into a table."""
    verbosity = tf.logging.get_verbosity()
    bars = tf.utils.logging.is_progress_bar_enabled()
    hub_bars = not hub_utils.are_progress_bars_disabled()
    tf.logging.set_verbosity_error()
    tf.utils.logging.disable_progress_bar()
    hub_utils.disable_progress_bars()
    try:
        yield
    finally:
        tf.logging.set_verbosity(verbosity)
        if bars:
            tf.utils.logging.enable_progress_bar()
        if hub_bars:
            hub_utils.enable_progress_bars()


class ZeroMLP(torch.nn.Module):
    def forward(self, x, **kwargs):
        return torch.zeros_like(x)


def hf_loop(model, ids: torch.Tensor, passes: int, ffn: bool) -> np.ndarray:
    """The paper's loop on HuggingFace blocks: (B, passes·L + 1) misalignment, in the
    model's dtype (`E` in float32)."""
    blocks = model.h
    if not ffn:  # as the paper's patch_skip_mlp, on copies-by-reference of the blocks
        for block in blocks:
            block.ln_2, block.mlp = torch.nn.Identity(), ZeroMLP()
    n, device = ids.shape[1], ids.device
    dtype = model.wte.weight.dtype
    mask = torch.full((n, n), torch.finfo(dtype).min, dtype=dtype,
                      device=device).triu(1)[None, None]
    with torch.no_grad():
        hidden = model.wte(ids) + model.wpe(torch.arange(n, device=device)[None])
        out = [misalignment(hidden.float())]
        for _ in range(passes):
            for block in blocks:
                res = block(hidden, attention_mask=mask)
                hidden = res[0] if isinstance(res, (tuple, list)) else res
                out.append(misalignment(hidden.float()))
            hidden = model.ln_f(hidden)
    return torch.stack(out, 1).cpu().numpy()  # waits for the device


def compile_loop(model, ids, *, passes: int, ffn: bool, dtype: str = "float32",
                 chunk: int | None = None, precision: str = "float32"):
    """Compile `jm.loop`'s program ahead of time: (compile seconds, a zero-argument
    call of the compiled program returning `E` (B, passes·L + 1)). `chunk`: prompts
    per block call (None: `jm.loop`'s default; 0: all prompts vmapped at once)."""
    args = (model, jnp.asarray(ids), jax.random.PRNGKey(0))
    if chunk is None:
        chunk = default_chunk(ids.shape[1], None)
    kwargs = dict(passes=passes, ffn=ffn, weights="trained", dtype=jnp.dtype(dtype),
                  depths=(), chunk=chunk or None, precision=precision)
    compile_s, compiled = time_call(lambda: loop_program.lower(*args, **kwargs).compile())
    return compile_s, lambda: jax.block_until_ready(compiled(*args, **kwargs)[0])


def time_call(fn) -> tuple[float, object]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def bench_variant(name, folder, model, ids, ffn: bool, args, side: TorchSide) -> dict:
    hf_model = CLASSES[name].from_pretrained(folder).eval()  # fresh: the patch mutates it
    hf_model = hf_model.to(side.device, getattr(torch, args.dtype))
    ids_t = side.tensor(ids)

    compile_s, run_jax = compile_loop(model, ids, passes=args.passes, ffn=ffn, dtype=args.dtype,
                                      chunk=args.chunk, precision=args.precision)
    run_jax()  # untimed first calls: a program's first execution also makes its kernels
    with side.matmul_mode():
        hf_loop(hf_model, ids_t, args.passes, ffn)
    jax_t, hf_t, pair_t = [], [], []
    # Interleaved pairs: `--repeats` of them, fewer where another pair would take
    # the total past twice `--budget-s` (the suite's rule, applied to pairs).
    while Timing.another(pair_t, args.repeats, 2 * args.budget_s):
        t_jax, E_jax = time_call(run_jax)
        with side.matmul_mode():
            t_hf, E_hf = time_call(lambda: hf_loop(hf_model, ids_t, args.passes, ffn))
        jax_t.append(t_jax / args.passes)
        hf_t.append(t_hf / args.passes)
        pair_t.append(t_jax + t_hf)
    jax_s, hf_s = (dataclasses.asdict(Timing.of_times(ts)) for ts in (jax_t, hf_t))
    config = hf_model.config
    return {
        "model": name, "variant": "full" if ffn else "attn", "dtype": args.dtype,
        "precision": args.precision, "device": side.device,
        "d": config.hidden_size, "layers": config.num_hidden_layers,
        "prompts": args.prompts,
        "tokens": args.tokens, "passes": args.passes, "jax_s_per_pass": jax_s,
        "hf_s_per_pass": hf_s, "speedup": hf_s["median"] / jax_s["median"],
        "jax_compile_s": compile_s,
        "max_rel_diff_E": float(np.max(np.abs(np.asarray(E_jax) - E_hf) / np.abs(E_hf))),
    }


def bench_model(name: str, args, rng, log=print) -> list[dict]:
    """Both variants of one model (`args`: the options of `benchmarks/loop_vs_hf.py`,
    `args.variants` of them); `log` (None: silent)
    gets each row as a JSON line as soon as it is measured."""
    torch.manual_seed(args.seed)
    side = TorchSide.choose(torch, args.precision)
    rows = []
    with quiet(), tempfile.TemporaryDirectory() as folder:
        CLASSES[name](CONFIGS[name]()).save_pretrained(folder)
        model = jm.load(folder)
        ids = rng.integers(0, model.config.vocab_size, (args.prompts, args.tokens))
        for ffn in (v == "full" for v in args.variants):
            rows.append(bench_variant(name, folder, model, ids, ffn, args, side))
            if log is not None:
                log(json.dumps(rows[-1]))
    return rows
