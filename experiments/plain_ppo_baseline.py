"""A plain whole-loop-jitted PPO (the PureJaxRL layout: one jit around everything, no loss
scaling, no metrics beyond returns) on gymnax CartPole-v1, to measure what a machine does
without our machinery: prints its compile time, steps/s and last return, 500k steps.

    python experiments/plain_ppo_baseline.py [fp32|fp16]
"""

import argparse
import time

import flax.linen as nn
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from _report import description
from flax.linen.initializers import orthogonal
from flax.training.train_state import TrainState

DT = jnp.float32  # the networks' compute dtype (the command line's precision when run as a script)
PRECISIONS = {"fp32": jnp.float32, "fp16": jnp.float16}


class AC(nn.Module):
    a: int

    @nn.compact
    def __call__(self, x):
        h = nn.tanh(nn.Dense(64, kernel_init=orthogonal(np.sqrt(2)), dtype=DT)(x))
        h = nn.tanh(nn.Dense(64, kernel_init=orthogonal(np.sqrt(2)), dtype=DT)(h))
        logits = nn.Dense(self.a, kernel_init=orthogonal(0.01), dtype=DT)(h).astype(jnp.float32)
        c = nn.tanh(nn.Dense(64, kernel_init=orthogonal(np.sqrt(2)), dtype=DT)(x))
        c = nn.tanh(nn.Dense(64, kernel_init=orthogonal(np.sqrt(2)), dtype=DT)(c))
        return logits, nn.Dense(1, dtype=DT)(c)[..., 0].astype(jnp.float32)


C = dict(LR=2.5e-4, NUM_ENVS=4, NUM_STEPS=128, T=500000, EP=4, MB=4)
NU = C["T"] // 512
env, ep = gymnax.make("CartPole-v1")


def train(rng):
    net = AC(2)
    params = net.init(rng, jnp.zeros(4))
    sched = lambda c: C["LR"] * (1 - (c // 16) / NU)
    ts = TrainState.create(
        apply_fn=net.apply, params=params, tx=optax.chain(optax.clip_by_global_norm(0.5), optax.adam(sched, eps=1e-5))
    )
    obs, es = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(rng, 4), ep)

    def upd(rs, _):
        def step(rs, _):
            ts, es, o, rng = rs
            rng, k1, k2 = jax.random.split(rng, 3)
            logits, v = net.apply(ts.params, o)
            a = jax.random.categorical(k1, logits)
            lp = jnp.take_along_axis(jax.nn.log_softmax(logits), a[:, None], 1)[:, 0]
            o2, es, r, term, trunc, info = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
                jax.random.split(k2, 4), es, a, ep
            )
            d = jnp.logical_or(term, trunc)
            return (ts, es, o2, rng), (d, a, v, r, lp, o)

        rs, (d, a, v, r, lp, o) = jax.lax.scan(step, rs, None, 128)
        ts, es, lo, rng = rs
        _, lv = net.apply(ts.params, lo)

        def g(c, t):
            gae, nv = c
            dd, vv, rr = t
            delta = rr + 0.99 * nv * (1 - dd) - vv
            gae = delta + 0.99 * 0.95 * (1 - dd) * gae
            return (gae, vv), gae

        _, adv = jax.lax.scan(g, (jnp.zeros_like(lv), lv), (d, v, r), reverse=True, unroll=16)
        tgt = adv + v

        def epoch(us, _):
            ts, rng = us
            rng, k = jax.random.split(rng)
            batch = jax.tree.map(lambda x: x.reshape((512,) + x.shape[2:]), (o, a, v, lp, adv, tgt))
            perm = jax.random.permutation(k, 512)
            mbs = jax.tree.map(lambda x: x[perm].reshape((4, -1) + x.shape[1:]), batch)

            def mb(ts, b):
                o, a, v, lp, adv, tgt = b

                def lf(p):
                    logits, val = net.apply(p, o)
                    lpa = jax.nn.log_softmax(logits)
                    nlp = jnp.take_along_axis(lpa, a[:, None], 1)[:, 0]
                    vc = v + (val - v).clip(-0.2, 0.2)
                    vl = 0.5 * jnp.maximum((val - tgt) ** 2, (vc - tgt) ** 2).mean()
                    ratio = jnp.exp(nlp - lp)
                    gg = (adv - adv.mean()) / (adv.std() + 1e-8)
                    al = -jnp.minimum(ratio * gg, jnp.clip(ratio, 0.8, 1.2) * gg).mean()
                    ent = -(jnp.exp(lpa) * lpa).sum(-1).mean()
                    return al + 0.5 * vl - 0.01 * ent

                loss, gr = jax.value_and_grad(lf)(ts.params)
                return ts.apply_gradients(grads=gr), loss

            ts, losses = jax.lax.scan(mb, ts, mbs)
            return (ts, rng), losses

        (ts, rng), _ = jax.lax.scan(epoch, (ts, rng), None, 4)
        return (ts, es, lo, rng), (r.sum(), d.sum())

    rs, m = jax.lax.scan(upd, (ts, es, obs, rng), None, NU)
    return m


def compiled_plain():
    """(compiled train(rng), env steps per call)."""
    return jax.jit(train).lower(jax.random.PRNGKey(0)).compile(), NU * 512


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("precision", nargs="?", choices=PRECISIONS, default="fp32", help="compute dtype (default fp32)")
    DT = PRECISIONS[parser.parse_args().precision]
    t = time.time()
    c, steps = compiled_plain()
    print("compile", time.time() - t)
    t = time.time()
    m = jax.block_until_ready(c(jax.random.PRNGKey(0)))
    dt = time.time() - t
    print("plain", DT.__name__, "steps/s", steps / dt, "last return", float(m[0][-50:].sum() / m[1][-50:].sum()))
