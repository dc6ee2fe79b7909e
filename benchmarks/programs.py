"""Programs a default `jaxattn run NAME` compiles, and how much of its wall time that is
(BENCHMARKS.md, "Programs and the persistent cache").

Each experiment (all of `jaxattn list`, or the names given) runs twice, each time in a
fresh process, sharing one fresh JAX cache folder: the first run fills the cache, the
second should read every program from it. Per run the table gives the programs XLA
compiled, those JAX refused to keep because they hold a host callback (by name), the
cache hits, the programs loaded whole (`_programs.kept_jit`, neither traced nor
lowered), and the share of the wall time spent tracing, lowering and compiling or
loading (JAX's monitoring duration events, and jaxattn's for a load: the time the run
waited for it). The last column is the loading done on other threads while the run
went on (`_programs.loaded_ahead`: the programs of the previous run of the command).

    python benchmarks/programs.py [NAME ...]

A NAME with spaces is a whole command line instead (`"sweep thm41-sphere --grid
beta=1,2"`, `"loop --model PATH --weights random"`), run with `--out` added.
"""

import json
import os
import subprocess
import sys
import tempfile

#: The child: the cache set through `jax.config`, every program kept, JAX's compile
#: events and its "Not writing persistent cache entry" log lines counted around one
#: in-process `jaxattn run NAME --out OUT`.
CHILD = r"""
import json, logging, re, sys, time
import jax
from jax import monitoring

cache, name, out, names = sys.argv[1:5]
jax.config.update("jax_compilation_cache_dir", cache)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
COMPILE = ("/jax/core/compile/backend_compile_duration",
           "/jax/core/compile/jaxpr_trace_duration",
           "/jax/core/compile/jaxpr_to_mlir_module_duration",
           "/jaxattn/programs/load_duration")
stats = {"programs": 0, "hits": 0, "loaded": 0, "compile_s": 0.0, "ahead_s": 0.0,
         "refused": [], "names": []}

def on_duration(event, seconds, **kw):
    if event == "/jaxattn/programs/load_ahead_duration":
        stats["ahead_s"] += seconds
    if event in COMPILE:
        stats["compile_s"] += seconds
    if event == COMPILE[0]:
        stats["programs"] += 1
    if event == COMPILE[3]:
        stats["loaded"] += 1

def on_event(event, **kw):
    if event == "/jax/compilation_cache/cache_hits":
        stats["hits"] += 1

class Refused(logging.Handler):
    def emit(self, record):
        message = record.getMessage()
        found = re.search(r"cache entry for '([^']+)' because it uses host callbacks", message)
        if found:
            stats["refused"].append(found.group(1))
        found = re.match(r"Compiling (\S+)", message)
        if found:
            stats["names"].append(found.group(1))

monitoring.register_event_duration_secs_listener(on_duration)
monitoring.register_event_listener(on_event)
# Program names need jax_log_compiles, which costs the cache its hits: asked for only.
jax.config.update("jax_log_compiles", names == "1")
for logger in ("jax._src.compiler", "jax._src.interpreters.pxla", "jax._src.dispatch"):
    log = logging.getLogger(logger)
    log.addHandler(Refused())
    log.setLevel(logging.DEBUG)
    log.propagate = False
from jaxattn import cli
start = time.perf_counter()
code = cli.main([*(name.split() if " " in name else ["run", name]), "--out", out])
stats["wall_s"] = time.perf_counter() - start
stats["exit"] = code
print("PROGRAMS " + json.dumps(stats))
"""


def measure(name: str, cache: str, out: str, names: bool = False) -> dict:
    """One run of `jaxattn run name` in a fresh process with the cache folder `cache`
    (with `names`, the compiled programs' names too, at the cost of the cache hits)."""
    # `jaxattn run` enables its cache from JAXATTN_CACHE_DIR: the same fresh folder.
    proc = subprocess.run([sys.executable, "-c", CHILD, cache, name, out, str(int(names))],
                          capture_output=True, text=True,
                          env={**os.environ, "JAXATTN_CACHE_DIR": cache})
    line = next((x for x in proc.stdout.splitlines() if x.startswith("PROGRAMS ")), None)
    if line is None:
        raise RuntimeError(f"{name}: the run failed:\n{proc.stderr[-2000:]}")
    return json.loads(line.removeprefix("PROGRAMS "))


def experiments() -> list[str]:
    from jaxattn.experiments import REGISTRY

    return list(REGISTRY)


def row(name: str, run: int, s: dict) -> str:
    refused = {n: s["refused"].count(n) for n in s["refused"]}
    names = ", ".join(f"`{n}`" + (f" ×{k}" if k > 1 else "") for n, k in refused.items())
    share = 100 * s["compile_s"] / s["wall_s"]
    compiled = s["programs"] - s["hits"]
    return (f"| {name} | {run} | {s['programs']} ({compiled}) | {len(s['refused'])} {names} | "
            f"{s['hits']} | {s['loaded']} | {s['wall_s']:.1f} | {s['compile_s']:.1f} | "
            f"{share:.0f} % | {s.get('ahead_s', 0.0):.1f} |")


def main(names: list[str], names_out: str | None = None) -> None:
    print("| experiment | run | programs (compiled) | refused (host callbacks) | cache hits "
          "| kept, loaded | wall s | compile s | compile share | loaded ahead s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in names or experiments():
        with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as out:
            for run in (1, 2):
                stats = measure(name, cache, f"{out}/{run}", names_out is not None)
                print(row(name, run, stats), flush=True)
                if names_out:
                    with open(f"{names_out}/{name}.{run}.json", "w") as f:
                        json.dump(stats, f)


if __name__ == "__main__":
    # PROGRAMS_JSON=DIR writes each run's counts and program names to DIR (the names
    # need jax_log_compiles, under which JAX's cache finds no hits: a separate measure).
    main(sys.argv[1:], os.environ.get("PROGRAMS_JSON"))
