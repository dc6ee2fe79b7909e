"""Figures of the paper 004 experiments, drawn from the saved data alone (so
`jaxattn plot DIR` redraws them)."""

import numpy as np

from .._artifacts import figures


def power_shared(data, stem, *, layer: int):
    """Eigenvalues, final-alignment histograms and alignment over prolonged depth; the
    title names the shared `layer`."""
    L = int(data["native_depth"])
    fig, axes = figures.pyplot().subplots(1, 3, figsize=(13.5, 3.9))
    lam = data["eig_modulus"]
    ax = axes[0]
    firsts = [data[f"eig_{tag}"][0] for tag in ("modulus", "step")]
    rest = lam[~np.isin(lam, firsts)]  # the two marked ones are drawn by their marks
    ax.scatter(rest.real, rest.imag, s=6, c="0.5", lw=0)
    # a filled star and a ring: both read when the two orders pick the same eigenvalue
    for tag, name, style in (("modulus", r"$|\lambda|$",
                              dict(s=80, marker="*", c="tab:red", edgecolors="k")),
                             ("step", r"$|1+\tau\lambda|$",
                              dict(s=200, marker="o", facecolors="none",
                                   edgecolors="tab:blue", lw=1.5))):
        l1 = data[f"eig_{tag}"][0]
        ax.scatter([l1.real], [l1.imag], zorder=5, clip_on=False, **style,
                   label=rf"$\lambda_1$ by {name} (case {int(data[f'case_{tag}'])})")
    ax.margins(0.12)  # the marks at the extreme eigenvalues stay whole
    ax.set(xlabel=r"Re $\lambda$", ylabel=r"Im $\lambda$", title=r"eigenvalues of $\Omega$")
    figures.legend_below(ax, ncol=1)
    ax = axes[1]
    bins = np.linspace(0, 1, 41)
    cs = data["cos_step"][:, L].reshape(-1, 2)
    cm = data["cos_modulus"][:, L].reshape(-1, 2)
    step, modulus = r"$|1+\tau\lambda|$", r"$|\lambda|$"
    # the subspace filled, the two v₁ alignments as outlines over it: none hides another
    ax.hist(cs[:, 1], bins, alpha=0.45, color="tab:green", label=f"2-D subspace ({step})")
    ax.hist(cs[:, 0], bins, histtype="step", color="tab:blue", lw=2.2,
            label=rf"$v_1$ ({step} order)")
    ax.hist(cm[:, 0], bins, histtype="step", color="tab:red", lw=1.2, ls="--",
            label=rf"$v_1$ ({modulus} order)")
    ax.set(xlabel=f"alignment after the native {L} layers", ylabel="tokens",
           title=f"alignment at the native depth {L}")
    figures.integer_ticks(ax.yaxis)  # a count of tokens
    figures.legend_below(ax, ncol=1)
    ax = axes[2]
    c = data["cos_step"][..., 0].mean(axis=2)  # (B, layers)
    ks = np.arange(c.shape[1])
    # wide to thin, later over earlier, so that where the curves coincide all show:
    # the |1+τλ| mean, the |λ| mean dashed over it, the prompts faint over both
    ax.plot(ks, c.mean(0), color="tab:blue", lw=2.4, label=rf"mean, $v_1$ by {step}")
    ax.plot(ks, data["cos_modulus"][..., 0].mean(axis=(0, 2)), color="tab:red", lw=1.1,
            ls=(0, (4, 2)), label=rf"mean, $v_1$ by {modulus}")
    ax.plot(ks, c[: min(40, len(c))].T, color="0.45", alpha=0.45, lw=0.6)
    ax.axvline(L, color="k", ls=":", lw=1, label=f"native depth {L}")
    ax.set(ylim=(0, 1.02), xlabel="layer", ylabel=r"$|\cos(x, v_1)|$ (per prompt, grey)",
           title="prolonged depth (paper 004 Fig. 6c)")
    figures.legend_below(ax, ncol=1)
    return figures.save_figure(fig, stem, title=f"power-shared: {data['label']}, layer "
                               f"{layer}'s weights in every layer")


def _band(ax, x, mean, std, color, label):
    ax.plot(x, mean, "o-", color=color, ms=3, lw=1.3, label=label)
    ax.fill_between(x, mean - std, mean + std, color=color, alpha=0.15, lw=0)


def layer_stats(axes, data):
    """Three panels: c vs c̄, Δ vs Δ̄, p vs p̄ over layers (paper 004 Fig. 2b)."""
    ell = np.arange(len(data["stat_c"]))
    _band(axes[0], ell, data["stat_c"], data["stat_c_std"], "tab:blue",
          r"$c_\ell$ (along $v_1$), mean ± std")
    axes[0].plot(ell, data["stat_c_bar"], "s--", color="tab:orange", ms=5, mfc="none",
                 label=r"$\bar c_\ell$ (all eigenvectors)")
    axes[0].set_ylabel(r"alignment after layer $\ell$")
    _band(axes[1], ell, data["stat_delta"], data["stat_delta_std"], "tab:blue",
          r"$\Delta_\ell$, mean ± std")
    _band(axes[1], ell, data["stat_delta_bar"], data["stat_delta_bar_std"], "tab:orange",
          r"$\bar\Delta_\ell$, mean ± std")
    axes[1].axhline(0, color="k", lw=0.6)
    axes[1].set_ylabel(r"increment through layer $\ell$")
    axes[2].plot(ell, data["stat_p"], "o-", color="tab:blue", ms=3, label=r"$p_\ell$")
    axes[2].plot(ell, data["stat_p_bar"], "s--", color="tab:orange", ms=3,
                 label=r"$\bar p_\ell$")
    axes[2].axhline(0.5, color="k", lw=0.6)
    # a probability of 0 or 1 keeps its whole marker
    axes[2].set(ylim=(-0.04, 1.04), ylabel="P(increment > 0)")
    for ax in axes:
        ax.set_xlabel(r"layer $\ell$")
        figures.integer_ticks(ax.xaxis)
        figures.legend_below(ax, ncol=1)


def power_layers(data, stem):
    fig, axes = figures.pyplot().subplots(1, 4, figsize=(15, 3.6))
    layer_stats(axes[:3], data)
    eig = data["eigenvalues"]
    ell = np.arange(eig.shape[0])
    for k in range(eig.shape[1]):
        axes[3].plot(ell, eig[:, k].real, "o-", ms=4, mfc="none", lw=1,
                     label=rf"Re $\lambda_{k + 1}$")  # open: crossing curves all show
    axes[3].set(xlabel=r"layer $\ell$", ylabel=r"Re $\lambda_k(\Omega_\ell)$")
    figures.integer_ticks(axes[3].xaxis)
    axes[3].set_title("leading eigenvalues (Fig. 6)", fontsize=9)
    figures.legend_below(axes[3], ncol=3)
    return figures.save_figure(fig, stem, title=f"power-layers: {data['label']}")


def steer(data, stem, *, gap: float):
    """steer's three panels; `gap` is the verdict's |λ₁/λ₂| threshold, marked on the sweep."""
    fig, axes = figures.pyplot().subplots(1, 3, figsize=(13, 3.7))
    ell = np.arange(len(data["c_u"]))
    ax = axes[0]
    ax.plot(ell, data["c_u"], "o-", color="tab:red", ms=4, lw=2.4, label="last layer steered")
    # open squares and a thinner dashed line over the red: where steering changes
    # nothing, both show
    ax.plot(ell, data["c_u_plain"], "s--", color="0.25", ms=6, mfc="none", lw=1.0,
            label="unsteered")
    ax.set(ylim=(0, 1.06), xlabel="layer (0 = input)", ylabel=r"mean $|\cos(x, u)|$",
           title=r"alignment with the target $u$")
    figures.integer_ticks(ax.xaxis)
    figures.legend_below(ax)
    ax = axes[1]
    ax.semilogx(data["gammas"], data["end_alignment"], "o-", color="tab:red", ms=4,
                label=r"tokens: mean $|\cos(x^L, u)|$")
    if "v1_u" in data:  # runs before 2026-12-01 saved no spectra
        ax.semilogx(data["gammas"], data["v1_u"], "s--", color="0.3", ms=4, mfc="none",
                    label=r"steered $|\langle v_1, u\rangle|$")
        past = data["gap_ratio"] >= gap
        if past.any():
            ax.axvline(data["gammas"][np.argmax(past)], color="0.5", ls=":", lw=1,
                       label=rf"$|\lambda_1/\lambda_2| \geq {gap:g}$ from here")
        figures.legend_below(ax)
    ax.set(ylim=(0, 1.06), xlabel=rf"$\gamma$   ($\|\Omega_L\|_2$ = {float(data['norm']):.3g})",
           ylabel="alignment with $u$", title=r"$\gamma$ sweep")
    ax = axes[2]
    ax.plot(ell[1:] - 1, data["stat_c"], "o-", color="tab:blue", ms=3,
            label=r"$c_\ell$ (along $v_1$ of $\Omega_\ell$)")
    ax.plot(ell[1:] - 1, data["stat_c_bar"], "s--", color="tab:orange", ms=5, mfc="none",
            label=r"$\bar c_\ell$ (all eigenvectors)")
    ax.set(ylim=(0, 1.06), xlabel=r"layer $\ell$",
           title=r"steered model: $c_\ell$ vs $\bar c_\ell$ (Fig. 2/9)")
    figures.integer_ticks(ax.xaxis)
    figures.legend_below(ax)
    return figures.save_figure(fig, stem, title=f"steer: {data['label']}")


def oja(data, stem, outcomes, tolerance):
    """`outcomes`: how Fig. 13's two perturbations ended (the verdict's words);
    `tolerance`: the residual below which an entry is a fixed point."""
    fig = figures.pyplot().figure(figsize=(15, 4.2))
    ax = fig.add_subplot(1, 4, 1)
    fixed = data["residual"] < tolerance
    for kind, marker in (("oja", "o"), ("head", "^")):
        for cons, color in ((True, "tab:blue"), (False, "tab:orange")):
            sel = fixed & (data["map"] == kind) & ((data["m"] == data["n"]) == cons)
            name = ("Oja" if kind == "oja" else "1 head") + (" consensus" if cons else " bipartite")
            ax.scatter(data["predicted"][sel], data["radius"][sel], s=14, marker=marker,
                       c=color if kind == "oja" else "none", edgecolors=color, label=name)
    lo, hi = np.nanmin(data["radius"][fixed]), np.nanmax(data["radius"][fixed])
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.6)
    ax.axhline(1, color="k", ls=":", lw=0.8)
    ax.set(xscale="log", yscale="log", xlabel="closed form (Thm 3 / Lemma 4)",
           ylabel=r"$\rho$(tangent jacfwd)")
    ax.set_title("stability of equilibria", fontsize=9)
    ax.legend(fontsize=6)
    for j in (0, 1):
        ax3 = fig.add_subplot(1, 4, 2 + j, projection="3d")
        figures.draw_sphere_trajectories(ax3, data["fig13_paths"][j])
        figures.view_towards(ax3, [1.0, 0.6, 0.5])
        figures.title_3d(ax3, f"perturbation {data['fig13_eps'][j]:.3g}: {outcomes[j]}",
                         fontsize=9)
    ax = fig.add_subplot(1, 4, 4)
    figures.draw_decay(ax, data["fig13_sizes"], data["fig13_dist"], order=1, stop=False, marker="o",
               ms=3)
    ax.axhline(0.5, color="k", ls=":", lw=0.8, label="escaped (0.5)")
    if not np.any(data["fig13_dist"] > figures.resolution(data["fig13_dist"].dtype, 1)):
        ax.text(0.5, 0.5, "every perturbation absorbed\n(distance below the floor)",
                transform=ax.transAxes, ha="center", va="center", fontsize=9)
    layers = int(data.get("fig13_layers", 400))  # folders before it was saved: 400
    ax.set(xscale="log", xlabel="tangent length (before normalising)",
           ylabel=f"distance to the bipartite point after {layers} layers")
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title(f"Fig. 13 basin (q = {float(data['fig13_q']):.3g}, n=10, m=8)", fontsize=9)
    return figures.save_figure(fig, stem, title="oja-bipartite: equilibria of eqs. 8–9")
