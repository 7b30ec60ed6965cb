"""Underflow telemetry: how much of a gradient float16 loses, layer by layer.

A float16 backward pass holds every gradient in float16, whose smallest normal number is
2^-14 (about 6.1e-5) and smallest subnormal 2^-24 (about 6e-8). A gradient entry below the
normal range keeps fewer significant bits (a subnormal), one below half the smallest
subnormal becomes 0: that part of the update is lost. Loss scaling multiplies the loss, so
every gradient, by the scale before the backward pass, lifting small entries into range.

`underflow_fractions` compares two gradients of the same loss at the same parameters: the
float32 backward's (`reference`) and the float16 backward's at the current loss scale
(`half`, scaled, not yet unscaled). For each layer (the parameter path without its last key,
so a Dense layer's kernel and bias count together), over the entries that are non-zero in
float32:

- `flushed`: the fraction that is 0 in the float16 backward;
- `underflow`: the fraction that is 0 or below float16's smallest normal there.

Where no float16 backward is at hand, `cast_to_half(reference, scale)` stands in for it: the
float32 gradient times the scale as float16 holds it (what underflows in the parameter
gradient itself, not in the activations' gradients before it).

>>> import jax.numpy as jnp
>>> reference = {"dense": {"kernel": jnp.array([1e-9, 1e-6, 1e-2, 0.0])}}
>>> out = underflow_fractions(reference, cast_to_half(reference, 1.0))
>>> float(out["dense"]["flushed"]), float(out["dense"]["underflow"])  # of the 3 non-zero entries
(0.3333333432674408, 0.6666666865348816)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from genesis_jax.amp.restore import key_name

FLOAT16_SMALLEST_NORMAL = float(np.finfo(np.float16).smallest_normal)  # 2^-14


def _by_layer(tree) -> dict[str, list]:
    """The leaves of `tree` by layer: a parameter's path without the last key ("actor/Dense_0"
    for "params/actor/Dense_0/kernel"), without a leading "params"."""
    layers: dict[str, list] = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        names = [key_name(k) for k in path]
        names = names[1:] if names[:1] == ["params"] else names
        layers.setdefault("/".join(names[:-1]) or (names[0] if names else ""), []).append(leaf)
    return layers


def cast_to_half(grads, scale):
    """`grads` (float32) times `scale`, rounded to float16 and back to float32: the values
    a float16 gradient at that scale would hold."""
    scale = jnp.asarray(scale, jnp.float32)
    return jax.tree.map(lambda g: (jnp.asarray(g, jnp.float32) * scale).astype(jnp.float16).astype(jnp.float32), grads)


def underflow_fractions(reference, half) -> dict[str, dict]:
    """{layer: {"flushed": fraction, "underflow": fraction, "nonzero": count}} of the
    entries non-zero in `reference` (module docstring); a layer with none has fractions 0.
    `reference` and `half` are trees of the same structure (the second at the loss scale)."""
    ref_layers, half_layers = _by_layer(reference), _by_layer(half)
    if ref_layers.keys() != half_layers.keys():
        raise ValueError("the float32 and float16 gradients have different layers")
    out = {}
    for layer, refs in ref_layers.items():
        live = jnp.concatenate([jnp.ravel(ref) != 0 for ref in refs])
        hal = jnp.abs(jnp.concatenate([jnp.ravel(jnp.asarray(h, jnp.float32)) for h in half_layers[layer]]))
        nonzero = jnp.sum(live, dtype=jnp.float32)
        lost = {"flushed": live & (hal == 0), "underflow": live & (hal < FLOAT16_SMALLEST_NORMAL)}
        out[layer] = {kind: jnp.sum(x, dtype=jnp.float32) / jnp.maximum(nonzero, 1.0) for kind, x in lost.items()}
        out[layer]["nonzero"] = nonzero
    return out


def underflow_metrics(reference, half) -> dict:
    """`underflow_fractions` as flat metrics: "underflow/LAYER", "flushed/LAYER", and over
    all layers' non-zero entries "underflow" and "flushed"."""
    fractions = underflow_fractions(reference, half)
    total = sum(f["nonzero"] for f in fractions.values())
    metrics = {}
    for kind in ("underflow", "flushed"):
        lost = sum(f[kind] * f["nonzero"] for f in fractions.values())
        metrics[kind] = lost / jnp.maximum(total, 1.0)
        metrics.update({f"{kind}/{layer}": f[kind] for layer, f in fractions.items()})
    return metrics
