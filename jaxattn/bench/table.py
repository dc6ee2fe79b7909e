"""The suite's result as a fixed-width text table: the device and precisions first,
then the peaks per precision and the copy bandwidth, then one line per figure."""

SHORT = {"float32": "f32", "tensorfloat32": "tf32", "bfloat16": "bf16"}


def _fmt(value, spec: str) -> str:
    return "" if value is None else format(value, spec)


def header(result: dict) -> list[str]:
    """The device line, the peaks per precision and the copy bandwidth."""
    meta = result.get("meta", {})
    torch = meta.get("torch_device")
    line = (f"device: {meta.get('device_label', meta.get('device', '?'))}"
            f" · JAX precision {meta.get('precision', 'float32')}"
            f" · size {meta.get('size', 'default')}")
    if torch:
        line += f" · PyTorch on {torch} ({meta.get('torch_precision')} matmul mode)"
        if meta.get("torch_note"):
            line += f": {meta['torch_note']}"
    lines = [line]
    peaks = result.get("peak_gflops")
    if not peaks:
        floors = any("exp_per_s" in r for r in result.get("rows", ()))
        return lines + ["matmul peaks: case `peak` not run" + (
            " (the MF floors below measure JAX's alone)" if floors else "")]
    parts = []
    for precision, figures in peaks.items():
        if figures is None:
            parts.append(f"{precision} not applicable (no TF32 units on this device)")
        else:
            parts.append(f"{precision} " + ", ".join(
                f"{k} {v:.0f}" for k, v in figures.items() if k != "best"))
    lines.append(f"matmul peak GFLOP/s ({meta.get('peak_size', '?')}²): " + " | ".join(parts))
    bw = result.get("bandwidth")
    if bw:
        lines.append(f"copy bandwidth GB/s (read + write, {bw['bytes'] / 2**20:.0f} MiB): "
                     + ", ".join(f"{k} {v:.1f}" for k, v in bw.items() if k != "bytes"))
    return lines


def _line(r: dict) -> str:
    """A row: case, variant, library, precision and its times (a gradient row, `G`:
    the gradient's, over the forward's), then what the row's case adds."""
    gradient = "gradient_s" in r
    seconds = r["gradient_s"] if gradient else r["median_s"]
    line = (f"{r['case']:4} {r['variant'][:42]:42} {r['library'][:22]:22} "
            f"{SHORT.get(r.get('precision'), ''):4} {seconds:9.4f} "
            f"{r['min_s']:8.4f} {r['max_s']:8.4f} {r['calls']:2d}")
    if gradient:
        return (f"{line} grad/fwd {r['gradient_over_forward']:.2f}"
                + (f", memory ×{r['memory_growth_4x_steps']:.2f} for 4× steps"
                   if r.get("memory_growth_4x_steps") else ""))
    pct = None if r["fraction_of_peak"] is None else 100 * r["fraction_of_peak"]
    return (f"{line} {r['token_steps_per_s']:11.3g} {_fmt(r['gflops'], '8.1f'):>8} "
            f"{_fmt(pct, '6.1f'):>6} {_fmt(r['compile_s'], '7.2f'):>7}"
            + _floor(r) + _pair_floor(r) + _noisy(r))


def _noisy(r: dict) -> str:
    """` E_T …` beside an SN row: the mean final misalignment ± its standard error, and
    on the torchsde row the z-score against jaxattn and jaxattn's speedup."""
    if "mean_final_misalignment" not in r:
        return ""
    line = f"  E_T {r['mean_final_misalignment']:.4f} ± {r['se_final_misalignment']:.4f}"
    if "z_vs_jax" in r:
        line += f", z vs jaxattn {r['z_vs_jax']:+.2f}, jaxattn ×{r['jaxattn_speedup']:.1f}"
    return line


def _floor(r: dict) -> str:
    """` floor …` beside a row that carries one (S1-large): flops at the matmul peak,
    unavoidable bytes at the copy bandwidth, and the time over the larger."""
    if "moved_bytes" not in r:
        return ""
    flops_s, bytes_s = r.get("floor_flops_s"), r.get("floor_bytes_s")
    if flops_s is None or bytes_s is None:
        return "  floor: run the `peak` case to measure it"
    floor = max(flops_s, bytes_s)
    return (f"  floor {floor:.4f} s (flops/peak {flops_s:.4f}, "
            f"{r['moved_bytes'] / 1e6:.3g} MB/bandwidth {bytes_s:.4f}); "
            f"×{r['median_s'] / floor:.0f}")


def _exp_rate(rows: list[dict]) -> list[str]:
    """The exp rate and matmul peak the mean-field floors used, once."""
    r = next((r for r in rows if "exp_per_s" in r), None)
    if r is None:
        return []
    return [f"MF floors: jnp.exp (best call) {r['exp_stream_per_s'] / 1e9:.3g} G/s once over "
            f"{r['exp_elements']:,} float32, {r['exp_cached_per_s'] / 1e9:.3g} G/s "
            f"{r['exp_cached_sweeps']}× over {r['exp_cached_elements']:,}, "
            f"{r['exp_register_per_s'] / 1e9:.3g} G/s in registers "
            f"({r['exp_register_method']}) (the fastest counts);"
            f" matmul peak {r['matmul_peak_gflops']:.4g} GFLOP/s"]


def _pair_floor(r: dict) -> str:
    """` floor …` beside a mean-field row (MF): its pairs' flops at the matmul peak and
    their exps at the measured exp rate, the time over the larger, the peak memory
    (and where it was read), and the gradient's time over the forward's."""
    if "floor_s" not in r:
        return ""
    stream = r.get("floor_exp_stream_s")  # the memory-bound exp floor (`jnp.exp` streamed)
    stream = "" if stream is None else f"; streamed exp {stream:.4g}"
    line = (f"  floor {r['floor_s']:.4g} s (matmul {r['floor_matmul_s']:.4g} at "
            f"{r['madds_per_pair']} madd/pair, exp {r['floor_exp_s']:.4g} at "
            f"{r['exps_per_pair']}/pair{stream}); ×{r['ratio_to_floor']:.2f}; memory "
            f"{_fmt(r['memory_bytes'] and r['memory_bytes'] / 1e6, '.4g')} MB compiled")
    if r.get("device_peak_bytes"):
        line += f", device peak {r['device_peak_bytes'] / 1e6:.4g} MB"
    if "gradient_over_forward" in r:
        line += f"; grad/fwd {r['gradient_over_forward']:.2f}"
    return line


def format_table(result: dict) -> str:
    """The suite's result (`suite.run_suite`) as a fixed-width text table; `%peak`
    is against the peak of the row's precision, blank where none applies."""
    head = (f"{'case':4} {'variant':42} {'library':22} {'prec':4} {'median s':>9} {'min':>8} "
            f"{'max':>8} {'n':>2} {'tok-steps/s':>11} {'GFLOP/s':>8} {'%peak':>6} "
            f"{'compile':>7}")
    lines = header(result) + [head, "-" * len(head)]
    lines += [_line(r) for r in result["rows"]]
    lines += _exp_rate(result["rows"])
    meta = result.get("meta", {})
    if "suite_s" in meta:
        lines.append(f"suite: {meta['suite_s']:.0f} s (" + ", ".join(
            f"{c} {t:.0f} s" for c, t in meta["case_s"].items()) + ")")
    lines += [f"skipped: {case} ({why})" for case, why in meta.get("skipped", {}).items()]
    return "\n".join(lines)
