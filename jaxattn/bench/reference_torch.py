"""The benchmark problems written the plain PyTorch way, as the reference jaxattn
is measured against: float32 tensors, the batch as the leading tensor axis, a
Python loop over steps under `torch.no_grad()`, `torchdiffeq` for the
adaptive ODE solve and `torchsde` for the noisy one. Same mathematics as `jaxattn`
(paper 001 eqs. 4 and 6).

Run by `jaxattn bench` when torch is installed, on the device of its inputs (the
suite puts them on JAX's device); not part of the library.
"""

import warnings

import torch


def raw_update(x, Qm, Km, U, beta, causal):
    """`v_i = Σ_η Σ_j α^η_ij U_η x_j` for a batch `x: (B, n, d)`.

    `Qm, Km: (h, k, d)` are the factors of `P_η = Q_ηᵀ K_η`; for an unfactored
    `P` pass `Qm = None, Km = P` (then the keys are `P x_j`).
    """
    if Qm is None:
        q = x.unsqueeze(1)  # (B, 1, n, d)
        k = torch.einsum("hde,bje->bhjd", Km, x)
    else:
        q = torch.einsum("hkd,bid->bhik", Qm, x)
        k = torch.einsum("hkd,bjd->bhjk", Km, x)
    s = beta * q @ k.transpose(-1, -2)  # (B, h, n, n)
    if causal:
        n = x.shape[1]
        mask = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()
        s = s.masked_fill(~mask, float("-inf"))
    a = torch.softmax(s, dim=-1)
    mixed = a @ x.unsqueeze(1)  # (B, h, n, d)
    return torch.einsum("bhid,hed->bie", mixed, U)


def layer(x, Qm, Km, U, beta, causal, tau):
    y = x + tau * raw_update(x, Qm, Km, U, beta, causal)
    return y / y.norm(dim=-1, keepdim=True)


def velocity(x, Qm, Km, U, beta, causal):
    v = raw_update(x, Qm, Km, U, beta, causal)
    return v - (x * v).sum(-1, keepdim=True) * x


def run_layers(x0, Qm, Km, U, beta, causal, tau, num_layers):
    """`num_layers` discrete layers; returns the misalignment after each."""
    with torch.no_grad():
        x = x0
        out = [misalignment(x)]
        for _ in range(num_layers):
            x = layer(x, Qm, Km, U, beta, causal, tau)
            out.append(misalignment(x))
        return torch.stack(out, -1)


def rk4(x0, Qm, Km, U, beta, causal, dt, steps):
    """Classical RK4 with a retraction onto the sphere after each step."""
    with torch.no_grad():
        x = x0
        f = lambda y: velocity(y, Qm, Km, U, beta, causal)  # noqa: E731
        for _ in range(steps):
            k1 = f(x)
            k2 = f(x + 0.5 * dt * k1)
            k3 = f(x + 0.5 * dt * k2)
            k4 = f(x + dt * k3)
            x = x + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
            x = x / x.norm(dim=-1, keepdim=True)
        return x


def adaptive(x0, Qm, Km, U, beta, causal, T, rtol=1e-6, atol=1e-8):
    """torchdiffeq's dopri5 on the whole batch as one state (one shared step size)."""
    import torchdiffeq  # optional even where torch is installed: imported on use

    ts = torch.tensor([0.0, T], dtype=x0.dtype, device=x0.device)
    with torch.no_grad():
        ys = torchdiffeq.odeint(
            lambda t, y: velocity(y, Qm, Km, U, beta, causal), x0, ts,
            rtol=rtol, atol=atol, method="dopri5",
        )
    return ys[-1]


def noisy_euler(x0, Qm, Km, U, beta, causal, sigma, dt, steps, seed=0):
    """torchsde's Itô Euler–Maruyama (`sdeint(method="euler")`) for tokens with
    independent noise on the sphere, the batch as one state `(B, n d)`:
    `dx_i = (P_{x_i} v_i − (d − 1)(σ²/2) x_i) dt + σ P_{x_i} dB^i` (the Itô form of
    `ja.TokenNoise`; general noise, its product `g_prod` written out). Returns the
    misalignment of each system at `T = steps · dt`."""
    import torchsde  # optional even where torch is installed: imported on use

    B, n, d = x0.shape
    shape, flat = (B, n, d), (B, n * d)

    class Sphere(torch.nn.Module):
        noise_type, sde_type = "general", "ito"

        def f(self, t, y):
            x = y.view(shape)
            v = velocity(x, Qm, Km, U, beta, causal) - (d - 1) * sigma**2 / 2 * x
            return v.reshape(flat)

        def g_prod(self, t, y, dB):
            x, w = y.view(shape), dB.view(shape)
            return (sigma * (w - (x * w).sum(-1, keepdim=True) * x)).reshape(flat)

    T = dt * steps
    ts = torch.tensor([0.0, T], dtype=x0.dtype, device=x0.device)
    with torch.no_grad(), warnings.catch_warnings():
        # its last step ends at T to rounding, past the interval by an ulp: said, harmless
        warnings.filterwarnings("ignore", message="Should have tb<=t1")
        bm = torchsde.BrownianInterval(0.0, T, size=flat, dtype=x0.dtype, device=x0.device,
                                       entropy=seed)
        ys = torchsde.sdeint(Sphere(), x0.reshape(flat), ts, bm=bm, method="euler", dt=dt)
    return misalignment(ys[-1].view(shape))


def grad_layers(x0, Qm, Km, U, beta, causal, tau, num_layers):
    """Gradient of the final mean misalignment w.r.t. `x0` by autograd."""
    x0 = x0.clone().requires_grad_(True)
    x = x0
    for _ in range(num_layers):
        x = layer(x, Qm, Km, U, beta, causal, tau)
    misalignment(x).sum().backward()
    return x0.grad


def misalignment(x):
    unit = x / x.norm(dim=-1, keepdim=True)
    return 1 - (unit[:, :1] * unit).sum(-1).mean(-1)
