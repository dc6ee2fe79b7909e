"""`jaxattn view DIR --out FILE.html`: a trajectory as one self-contained web page.

The page holds its data and a small canvas renderer (nothing fetched); what it shows:
see docs/usage/animations.md. It exposes `window.jaxattnView` (`frame()`,
`setFrame(i)`, `positions()`: the tokens' screen coordinates) for the tests that
drive it in a headless browser.
"""

import html
import json
from pathlib import Path

import numpy as np

from .._files import atomic_write
from .animate import _picks, as_written, frame_unit, trajectory_arrays, unit_ball
from .figures import resolution
from .trajectories import tokens_title

#: The most numbers (saves × tokens × 3) a page embeds: its saves are thinned to fit.
MAX_NUMBERS = 1_500_000


def view_html(xs, ts=None, *, E=None, title: str = "", layers: bool = False) -> str:
    """The page for the trajectory `xs (T, n, d)` at times `ts` (default: steps)."""
    unit = frame_unit(ts, layers)
    xs, ts, E, dtype = trajectory_arrays(xs, ts, E, per="save")
    title = title or tokens_title(xs)
    count, n, d = xs.shape
    xs, note = unit_ball(xs)
    picks = _picks(count, max(2, MAX_NUMBERS // (n * min(d, 3))))
    xs, ts, E = xs[picks], ts[picks], E[picks]
    if xs.shape[2] == 2:
        xs = np.concatenate([xs, np.zeros(xs.shape[:2] + (1,))], axis=-1)
    data = {
        "xs": np.round(xs, 4).reshape(-1).tolist(), "T": int(xs.shape[0]), "n": int(n),
        "flat": d == 2, "ts": np.round(ts, 6).tolist(),
        "E": [float(f"{v:.4g}") for v in E], "unit": unit, "note": note,
        "floor": resolution(dtype), "dtype": np.dtype(dtype).name,
    }
    hint = ("Filled dots: the tokens on the circle." if d == 2 else
            "Drag the sphere to turn it. Filled dots: near side; rings: far side.")
    return (_PAGE.replace("__TITLE__", html.escape(title)).replace("__HINT__", hint)
            .replace("__DATA__", json.dumps(data, separators=(",", ":"))))


def write_view(path, xs, ts=None, **kwargs) -> Path:
    """Write `view_html(xs, ts, …)` to `path` (whole or not at all)."""
    page = view_html(xs, ts, **kwargs).encode("utf-8")
    with as_written(Path(path)):
        return atomic_write(path, lambda f: f.write(page))


_PAGE = r"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>__TITLE__</title>
<style>
 body { font: 14px system-ui, sans-serif; margin: 0; background: #fff; color: #222; }
 main { max-width: 680px; margin: 0 auto; padding: 12px; text-align: center; }
 h1 { font-size: 17px; font-weight: 600; margin: 6px 0; }
 #sphere { touch-action: none; cursor: grab; display: block; margin: 0 auto; }
 #energy { display: block; margin: 0 auto; }
 .row { display: flex; align-items: center; gap: 10px; justify-content: center; }
 #time { flex: 1; max-width: 460px; }
 #label { font-family: ui-monospace, monospace; min-width: 190px; text-align: left; }
 .note { color: #555; font-size: 12px; }
</style></head>
<body><main>
<h1>__TITLE__</h1>
<canvas id="sphere" width="560" height="560" aria-label="the tokens"></canvas>
<div class="row"><button id="play" type="button">play</button>
<input id="time" type="range" min="0" value="0" step="1" aria-label="time">
<span id="label"></span></div>
<canvas id="energy" width="560" height="150" aria-label="E(t)"></canvas>
<p class="note" id="note"></p>
<p class="note">__HINT__</p>
</main>
<script>
"use strict";
const DATA = __DATA__;
(function () {
  const T = DATA.T, n = DATA.n, xs = DATA.xs, TRAIL = 8;
  const sphere = document.getElementById("sphere"), ctx = sphere.getContext("2d");
  const energy = document.getElementById("energy"), ectx = energy.getContext("2d");
  const slider = document.getElementById("time"), label = document.getElementById("label");
  const play = document.getElementById("play");
  document.getElementById("note").textContent = DATA.note;
  slider.max = String(T - 1);
  let frame = 0, yaw = DATA.flat ? 0 : -0.6, pitch = DATA.flat ? Math.PI / 2 : 0.35;
  let timer = null;
  if (!DATA.flat) {  // face the tokens' mean direction over the whole trajectory
    let c = [0, 0, 0];
    for (let k = 0; k < xs.length; k++) c[k % 3] += xs[k];
    const norm = Math.hypot(c[0], c[1], c[2]);
    if (norm > 1e-9) {
      c = c.map(v => v / norm);
      pitch = Math.max(-0.9, Math.min(0.9, Math.asin(c[2])));
      let best = -2;
      for (let a = 0; a < 2 * Math.PI; a += 0.02) {
        const w = Math.sin(a) * c[0] + Math.cos(a) * c[1];
        const near = Math.sin(pitch) * c[2] - Math.cos(pitch) * w;
        if (near > best) { best = near; yaw = a; }
      }
    }
  }
  const W = sphere.width, H = sphere.height, R = 0.44 * Math.min(W, H);
  const colors = [];
  for (let i = 0; i < n; i++) {
    const hue = n <= 10 ? [210, 30, 120, 0, 270, 20, 320, 0, 60, 185][i] : 300 * i / n;
    const light = n <= 10 && (i === 7) ? 45 : 50;
    colors.push([hue, n <= 10 && i === 7 ? 0 : 70, light]);
  }
  function hsl(c, a) { return "hsla(" + c[0] + "," + c[1] + "%," + c[2] + "%," + a + ")"; }
  function project(t, i) {
    const k = 3 * (t * n + i), x = xs[k], y = xs[k + 1], z = xs[k + 2];
    const cy = Math.cos(yaw), sy = Math.sin(yaw), cp = Math.cos(pitch), sp = Math.sin(pitch);
    const u = cy * x - sy * y, w = sy * x + cy * y;   // turn about the vertical axis
    const v = cp * z + sp * w, depth = -sp * z + cp * w;  // tilt: depth < 0 is near
    return [W / 2 + R * u, H / 2 - R * v, -depth];
  }
  function drawSphere() {
    ctx.clearRect(0, 0, W, H);
    const g = ctx.createRadialGradient(W / 2 - 0.35 * R, H / 2 - 0.4 * R, 0.1 * R,
                                       W / 2, H / 2, R);
    g.addColorStop(0, "#e6eef9"); g.addColorStop(1, "#8d9aaa");
    ctx.beginPath(); ctx.arc(W / 2, H / 2, R, 0, 2 * Math.PI);
    ctx.fillStyle = DATA.flat ? "#ffffff" : g; ctx.fill();
    ctx.strokeStyle = "#666"; ctx.lineWidth = 1.2; ctx.stroke();
  }
  function drawTokens() {
    const start = Math.max(0, frame - TRAIL), now = [];
    for (let i = 0; i < n; i++) {
      let prev = project(start, i);
      for (let t = start + 1; t <= frame; t++) {
        const p = project(t, i), near = p[2] >= 0 && prev[2] >= 0;
        ctx.strokeStyle = hsl(colors[i], (near ? 0.9 : 0.3) * (t - start) / (frame - start + 1));
        ctx.lineWidth = 2; ctx.beginPath(); ctx.moveTo(prev[0], prev[1]);
        ctx.lineTo(p[0], p[1]); ctx.stroke(); prev = p;
      }
      now.push([project(frame, i), i]);
    }
    now.sort((a, b) => a[0][2] - b[0][2]);  // far first
    for (const [p, i] of now) {
      ctx.beginPath(); ctx.arc(p[0], p[1], p[2] >= 0 || DATA.flat ? 6 : 5, 0, 2 * Math.PI);
      if (p[2] >= 0 || DATA.flat) {
        ctx.fillStyle = hsl(colors[i], 1); ctx.fill();
        ctx.strokeStyle = "#222"; ctx.lineWidth = 1; ctx.stroke();
      } else {
        ctx.strokeStyle = hsl(colors[i], 0.7); ctx.lineWidth = 1.8; ctx.stroke();
      }
    }
  }
  // E ends at the resolution of its dtype: below, rounding noise
  const E = DATA.E.map(v => v > DATA.floor ? v : NaN), positive = E.filter(v => v > 0);
  function when(t) {
    return DATA.unit === "t" ? "t = " + t : DATA.unit + " " + Math.round(t);
  }
  const logScale = positive.length > 1 && Math.max(...positive) / Math.min(...positive) > 100;
  const eLow = logScale ? Math.log10(Math.min(...positive)) : Math.min(0, ...E);
  const eHigh = logScale ? Math.log10(Math.max(...positive)) : Math.max(...E, 1e-300);
  function ey(v) {
    const y = logScale ? Math.log10(Math.max(v, Math.min(...positive))) : v;
    return 10 + (energy.height - 35) * (1 - (y - eLow) / ((eHigh - eLow) || 1));
  }
  function ex(t) { return 50 + (energy.width - 65) * t / Math.max(T - 1, 1); }
  function drawEnergy() {
    const c = ectx, h = energy.height;
    c.clearRect(0, 0, energy.width, h);
    c.strokeStyle = "#999"; c.lineWidth = 1; c.beginPath();
    c.moveTo(50, 10); c.lineTo(50, h - 25); c.lineTo(energy.width - 15, h - 25); c.stroke();
    c.fillStyle = "#333"; c.font = "12px sans-serif";
    c.fillText(logScale ? "log E" : "E", 8, 20);
    c.fillText(when(DATA.ts[0]), 50, h - 8);
    c.fillText("(by save)", energy.width / 2 - 20, h - 8);
    const end = when(Number(DATA.ts[T - 1].toPrecision(4)));
    c.fillText(end, energy.width - 15 - c.measureText(end).width, h - 8);
    c.strokeStyle = "#333"; c.lineWidth = 1.4; c.beginPath();
    for (let t = 0; t < T && E[t] > 0; t++) {
      t ? c.lineTo(ex(t), ey(E[t])) : c.moveTo(ex(t), ey(E[t]));
    }
    c.stroke();
    c.strokeStyle = "rgba(214,39,40,0.6)"; c.beginPath();
    c.moveTo(ex(frame), 10); c.lineTo(ex(frame), h - 25); c.stroke();
    if (E[frame] > 0) {
      c.fillStyle = "#d62728"; c.beginPath(); c.arc(ex(frame), ey(E[frame]), 5, 0, 2 * Math.PI);
      c.fill();
    }
  }
  function render() {
    drawSphere(); drawTokens(); drawEnergy();
    const t = DATA.ts[frame];
    label.textContent = (DATA.unit === "t" ? "t = " + t.toFixed(3) : when(t)) + "   " +
      (E[frame] > 0 ? "E = " + E[frame].toExponential(2)
       : "E < " + DATA.floor.toExponential(1) + " (" + DATA.dtype + " resolution)");
  }
  function setFrame(i) {
    frame = Math.max(0, Math.min(T - 1, i | 0)); slider.value = String(frame); render();
  }
  slider.addEventListener("input", () => setFrame(Number(slider.value)));
  play.addEventListener("click", () => {
    if (timer) { clearInterval(timer); timer = null; play.textContent = "play"; return; }
    if (frame >= T - 1) setFrame(0);
    play.textContent = "pause";
    timer = setInterval(() => {
      if (frame >= T - 1) { clearInterval(timer); timer = null; play.textContent = "play"; return; }
      setFrame(frame + 1);
    }, 50);
  });
  let drag = null;
  sphere.addEventListener("pointerdown", e => {
    if (DATA.flat) return;
    drag = [e.clientX, e.clientY]; sphere.setPointerCapture(e.pointerId);
  });
  sphere.addEventListener("pointermove", e => {
    if (!drag) return;
    yaw += (e.clientX - drag[0]) * 0.01;
    pitch = Math.max(-1.5, Math.min(1.5, pitch + (e.clientY - drag[1]) * 0.01));
    drag = [e.clientX, e.clientY]; render();
  });
  sphere.addEventListener("pointerup", () => { drag = null; });
  window.jaxattnView = {
    frame: () => frame, setFrame: setFrame, frames: T,
    turn: (dy, dp) => { yaw += dy; pitch += dp; render(); },
    positions: () => {
      const out = []; for (let i = 0; i < n; i++) out.push(project(frame, i)); return out;
    },
  };
  render();
})();
</script></body></html>
"""
