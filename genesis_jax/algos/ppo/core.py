"""PPO's networks, optimizer, train state and the update from a rollout.

A rollout arrives as `Transition`s ([T, N, ...] arrays), has its truncations bootstrapped,
and is learned from as shuffled `Minibatch`es.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from genesis_jax.algos.ppo.config import PPOConfig
from genesis_jax.algos.ppo.loss import Minibatch, Transition, bootstrap_truncated, compute_gae, ppo_loss
from genesis_jax.amp import TrainState
from genesis_jax.amp.policy import get_precision
from genesis_jax.amp.telemetry import underflow_metrics
from genesis_jax.envs.registry import EnvSpec
from genesis_jax.nets import distributions
from genesis_jax.nets.actor_critic import ActorCritic
from genesis_jax.nets.torsos import default_network


def make_network(config: PPOConfig, spec: EnvSpec, precision) -> ActorCritic:
    """The actor-critic for `spec`'s spaces: `config.network`, else the default for the
    observation shape (`cnn` for images, `mlp` otherwise)."""
    return ActorCritic(
        action_dim=spec.action_dim,
        continuous=spec.continuous,
        hidden=config.hidden,
        activation=config.activation,
        dtype=precision.compute_dtype,
        param_dtype=jnp.float32,
        network=config.network or default_network(spec.obs_shape),
        obs_shape=spec.obs_shape,
        width=config.width,
        depth=config.depth,
    )


def make_optimizer(config: PPOConfig) -> optax.GradientTransformation:
    """Adam (eps 1e-5); the learning rate anneals linearly per update when asked.

    Clipping is done by the update step on the unscaled gradients, not here."""
    if not config.anneal_lr:
        return config.adam(config.lr, eps=1e-5)
    steps_per_update = config.update_epochs * config.num_minibatches

    def schedule(count):
        return config.lr * (1.0 - (count // steps_per_update) / config.num_updates)

    return config.adam(schedule, eps=1e-5)


def init_train_state(config: PPOConfig, spec: EnvSpec, key) -> TrainState:
    net_key, _ = jax.random.split(key)  # (the second key once seeded a state field; kept for the same params)
    network = make_network(config, spec, config.train_precision())
    params = network.init(net_key, jnp.zeros((1, *spec.obs_shape), jnp.float32))
    return config.create_train_state(params, make_optimizer(config))


def mismatch_metrics(log_mu, log_pi) -> dict:
    """The Precision-RL training-inference mismatch between rollout (mu) and learner (pi),
    from both policies' log-probabilities of the taken actions (densities for continuous
    actions): KL estimators v1 and v2, the largest probability gap, the mean |ratio - 1|."""
    diff = log_mu - log_pi
    return {
        "mismatch_kl_v1": jnp.mean(diff),
        "mismatch_kl_v2": 0.5 * jnp.mean(jnp.square(diff)),
        "mismatch_max_dp": jnp.max(jnp.abs(jnp.exp(log_mu) - jnp.exp(log_pi))),
        "mismatch_ratio_dev": jnp.mean(jnp.abs(jnp.exp(log_pi - log_mu) - 1.0)),
    }


def truncation_values(truncated, final_obs, value_fn, max_truncations: int | None = None):
    """[T, N] float32: V(pre-reset observation) where an episode was truncated, else 0.

    With `max_truncations` (a bound that holds for the env: num_envs x ceil(T / time
    limit)), only the truncated observations are evaluated, gathered into a fixed-size
    batch; the whole-rollout pass remains the fallback should the bound ever not hold.
    Without it, the whole-rollout pass runs when any episode was truncated."""
    zeros = jnp.zeros(truncated.shape, jnp.float32)
    count = jnp.sum(truncated)
    full = lambda: jnp.where(truncated, value_fn(final_obs), 0.0).astype(jnp.float32)  # noqa: E731
    if max_truncations is None:
        return jax.lax.cond(count > 0, full, lambda: zeros)
    flat_obs = final_obs.reshape((-1,) + final_obs.shape[2:])

    def gathered():
        index = jnp.nonzero(truncated.reshape(-1), size=max_truncations, fill_value=0)[0]
        values = jnp.where(jnp.arange(max_truncations) < count, value_fn(flat_obs[index]), 0.0)
        return zeros.reshape(-1).at[index].add(values.astype(jnp.float32)).reshape(truncated.shape)

    return jax.lax.cond(count > max_truncations, full, gathered)


def finish_rollout(steps: Transition, value_fn, gamma: float, max_truncations: int | None = None) -> Transition:
    """The rollout with truncated episodes' rewards bootstrapped from V(pre-reset observation)
    (see `truncation_values`): what the update learns from."""
    final_value = truncation_values(steps.truncated, steps.final_obs, value_fn, max_truncations)
    return steps.replace(
        reward=bootstrap_truncated(steps.reward, steps.truncated, steps.terminated, final_value, gamma)
    )


def max_truncations(config: PPOConfig, spec: EnvSpec) -> int | None:
    """At most one truncation per env per time limit's worth of steps; None if unknown."""
    if not spec.max_episode_steps:
        return None
    return config.num_envs * -(-config.num_steps // spec.max_episode_steps)


def _flatten_time_env(tree):
    return jax.tree.map(lambda x: x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:]), tree)


def make_update_fn(config: PPOConfig, spec: EnvSpec, train_step):
    """`update(train_state, traj, last_value, key) -> (train_state, metrics)`: GAE, the
    mismatch measurement, then epochs x minibatches of `train_step(state, loss_fn, batch)`
    (the algorithm's `amp.train_step`)."""

    def make_loss(network):
        def loss_fn(params, batch: Minibatch):
            pi_params, values = network.apply(params, batch.obs)
            loss, aux = ppo_loss(
                pi_params, values, batch, config.clip_eps, config.vf_coef, config.ent_coef, config.clip_value
            )
            # The learner's view, kept for the mismatch metric (read on the first minibatch only).
            aux["log_pi"] = distributions.log_prob(pi_params, batch.action)
            return loss, aux

        return loss_fn

    loss_fn = make_loss(make_network(config, spec, config.train_precision()))
    # The opt-in underflow telemetry: the update's first minibatch through a float32 and a
    # float16 backward (at the current loss scale), before the update changes the params.
    loss32, loss16 = (make_loss(make_network(config, spec, get_precision(p))) for p in ("fp32", "fp16"))

    def telemetry(train_state: TrainState, batch: Minibatch) -> dict:
        if not config.underflow_telemetry:
            return {}
        scale = train_state.scaler.loss_scale
        reference = jax.grad(lambda p: loss32(p, batch)[0])(train_state.params)
        half = jax.grad(lambda p: loss16(p, batch)[0] * scale)(train_state.params)
        return underflow_metrics(reference, half)

    scalar_names = "loss grad_norm grads_finite policy_loss value_loss entropy approx_kl clip_fraction".split()

    def step(state, batch):
        """One minibatch step; its scalar metrics leave the loop as one float32 vector (one
        write per step instead of one per metric: on small networks the loop is op-bound)."""
        state, metrics = train_step(state, loss_fn, batch)
        aux = metrics.pop("aux")
        values = {**metrics, **aux}
        scalars = jnp.stack([jnp.asarray(values[k], jnp.float32) for k in scalar_names])
        return state, (scalars, aux["log_pi"])

    def update(train_state: TrainState, traj: Transition, last_value, key):
        done = jnp.logical_or(traj.terminated, traj.truncated)
        advantages, targets = compute_gae(traj.reward, traj.value, done, last_value, config.gamma, config.gae_lambda)
        data = _flatten_time_env(
            Minibatch(
                obs=traj.obs,
                action=traj.action,
                log_prob=traj.log_prob,
                value=traj.value,
                advantage=advantages,
                target=targets,
            )
        )

        underflow = telemetry(train_state, jax.tree.map(lambda x: x[: config.minibatch_size], data))

        def epoch(state, epoch_key):
            perm = jax.random.permutation(epoch_key, config.batch_size)
            shuffled = jax.tree.map(lambda x: x[perm].reshape((config.num_minibatches, -1) + x.shape[1:]), data)
            state, metrics = jax.lax.scan(step, state, shuffled)
            return state, (metrics, shuffled.log_prob[0])

        skipped_before = train_state.skipped
        epoch_keys = jax.random.split(key, config.update_epochs)
        train_state, ((scalars, log_pi), first_log_mu) = jax.lax.scan(epoch, train_state, epoch_keys)
        per_step = dict(zip(scalar_names, jnp.moveaxis(scalars, -1, 0)))
        # The mismatch on the update's first minibatch: the only one the learner evaluates
        # before any parameter change, so it costs no extra forward pass.
        mismatch = mismatch_metrics(first_log_mu[0], log_pi[0, 0])
        finite = per_step.pop("grads_finite") > 0
        finite_mean = lambda x: jnp.sum(jnp.where(finite, x, 0.0)) / jnp.maximum(jnp.sum(finite), 1)  # noqa: E731
        return train_state, {
            "loss": finite_mean(per_step.pop("loss")),
            "grad_norm": finite_mean(per_step.pop("grad_norm")),
            "loss_scale": train_state.scaler.loss_scale,
            "skipped": train_state.skipped - skipped_before,
            "halted": train_state.halted,
            **{k: jnp.mean(v) for k, v in per_step.items()},
            **mismatch,
            **underflow,
        }

    return update
