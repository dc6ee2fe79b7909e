"""`ja.theory.classify` on the model's variants: no theorem covers a model that is
not the papers' (post-normalised, softmax, no window or mask), and the summary says
why no theorem applies, for any model."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxattn as ja

T = ja.theory


def _theorem_41_model(**kw):
    """Full attention, U = I: Theorem 4.1's model (and 3.2's with one head, P = I)."""
    P = jnp.eye(3)[None]
    return ja.SelfAttentionDynamics(P, jnp.eye(3)[None], **kw)


def test_the_papers_model_is_still_covered():
    cls = T.classify(_theorem_41_model())
    assert set(cls.theorems) == {"3.2", "4.1"}
    for r in cls.reports:
        form = [c for c in r.checks if c.name in ("post-normalisation (eq. 4, 6)",
                                                  "softmax attention (rows summing to one)",
                                                  "no window or mask")]
        assert len(form) == 3 and all(c.holds for c in form)


@pytest.mark.parametrize(("kw", "failed", "why"), [
    (dict(norm="pre"), "post-normalisation (eq. 4, 6)", "tokens leave E_W"),
    (dict(norm="peri"), "post-normalisation (eq. 4, 6)", "tokens leave E_W"),
    (dict(norm="ngpt"), "post-normalisation (eq. 4, 6)", "a different flow on E_W"),
    (dict(norm="none"), "post-normalisation (eq. 4, 6)", "no normalisation"),
    (dict(kernel="sigmoid"), "softmax attention (rows summing to one)", "not normalised"),
    (dict(kernel="exp"), "softmax attention (rows summing to one)", "exp(s)/n"),
    (dict(window=2), "no window or mask", "a window |i − j| < 2"),
    (dict(mask=np.eye(4, dtype=bool)), "no window or mask", "a mask"),
])
def test_no_theorem_covers_a_variant(kw, failed, why):
    cls = T.classify(_theorem_41_model(**kw))
    assert cls.theorems == ()
    for r in cls.reports:
        assert failed in r.failed
        assert why in str(r)  # the report names the reason
    summary = cls.summary()
    assert summary.startswith("no theorem of paper 001 applies to this model: ")
    assert summary.count(failed) == 5  # each theorem, with the hypothesis that fails


def test_summary_says_why_for_any_model():
    # causal, two heads, U not a multiple of I: each theorem fails for its own reasons
    U = jnp.stack([jnp.diag(jnp.array([1.0, 2.0, 3.0])), -jnp.eye(3)])
    dyn = ja.SelfAttentionDynamics(jnp.ones((2, 3, 3)), U, causal=True)
    cls = T.classify(dyn)
    summary = cls.summary()
    print(summary)
    assert cls.theorems == ()
    for r in cls.reports:
        assert r.failed and f"Theorem {r.theorem} needs {', '.join(r.failed)}" in summary
    assert "Theorem 3.2 needs full attention, one head" in summary
    assert "Theorem 5.2 needs one head" in summary
    assert "post-normalisation" not in summary  # the papers' form holds: not a reason


def test_predict_on_a_variant_predicts_nothing():
    dyn = _theorem_41_model(norm="none")
    x0 = ja.sample_ellipsoid(jax.random.PRNGKey(0), 4, 3)
    pred = T.predict(dyn, x0)
    assert pred.theorem is None and pred.outcome == "none"
    assert "Theorem 4.1 needs post-normalisation" in pred.statement
