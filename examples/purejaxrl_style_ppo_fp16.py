"""PPO on gymnax CartPole-v1 in PureJaxRL's single-file layout: `make_train(config)` returns a
pure `train(rng)`, and the whole loop (rollout, GAE, epochs, minibatches) runs under one `jit`.
`purejaxrl_style_ppo.py` trains in float32; `purejaxrl_style_ppo_fp16.py` is the same file in
float16 with genesis-jax's loss scaling and skipped steps: `diff` the two to see the change.

Usage: python examples/purejaxrl_style_ppo[_fp16].py [total_timesteps]
"""

import sys
from typing import NamedTuple

import flax.linen as nn
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from genesis_jax import amp

CONFIG = {
    "LR": 2.5e-4, "NUM_ENVS": 4, "NUM_STEPS": 128, "TOTAL_TIMESTEPS": 500_000, "UPDATE_EPOCHS": 4,
    "NUM_MINIBATCHES": 4, "GAMMA": 0.99, "GAE_LAMBDA": 0.95, "CLIP_EPS": 0.2, "ENT_COEF": 0.01,
    "VF_COEF": 0.5, "MAX_GRAD_NORM": 0.5, "ENV_NAME": "CartPole-v1", "DTYPE": jnp.float16,
}


class ActorCritic(nn.Module):
    action_dim: int
    dtype: jnp.dtype = jnp.float32

    def _tower(self, x, name):
        for i in range(2):
            x = nn.tanh(nn.Dense(64, kernel_init=nn.initializers.orthogonal(np.sqrt(2)), dtype=self.dtype,
                                 name=f"{name}_{i}")(x))
        return x

    @amp.precision_rules()  # the heads ("*head") and any norms compute in float32
    @nn.compact
    def __call__(self, x):
        logits = nn.Dense(self.action_dim, kernel_init=nn.initializers.orthogonal(0.01), dtype=self.dtype,
                          name="actor_head")(self._tower(x, "actor"))
        value = nn.Dense(1, kernel_init=nn.initializers.orthogonal(1.0), dtype=self.dtype,
                         name="critic_head")(self._tower(x, "critic"))
        return logits.astype(jnp.float32), value[..., 0].astype(jnp.float32)


TrainState = amp.TrainState  # Flax's, plus a loss scaler; tx is wrapped to skip non-finite steps


class Transition(NamedTuple):
    done: jax.Array
    action: jax.Array
    value: jax.Array
    reward: jax.Array
    log_prob: jax.Array
    obs: jax.Array
    episode_return: jax.Array  # the return of an episode that ended at this step, else NaN


def make_train(config):
    config = {**CONFIG, **config}
    num_updates = config["TOTAL_TIMESTEPS"] // (config["NUM_ENVS"] * config["NUM_STEPS"])
    batch_size = config["NUM_ENVS"] * config["NUM_STEPS"]
    env, env_params = gymnax.make(config["ENV_NAME"])
    network = ActorCritic(env.action_space(env_params).n, dtype=config["DTYPE"])

    def schedule(count):
        frac = 1.0 - (count // (config["NUM_MINIBATCHES"] * config["UPDATE_EPOCHS"])) / num_updates
        return config["LR"] * frac

    tx = optax.chain(optax.clip_by_global_norm(config["MAX_GRAD_NORM"]), optax.adam(schedule, eps=1e-5))

    def loss_fn(params, traj, advantages, targets):
        logits, value = network.apply(params, traj.obs)
        log_probs = jax.nn.log_softmax(logits)
        log_prob = jnp.take_along_axis(log_probs, traj.action[:, None], axis=1)[:, 0]
        value_clipped = traj.value + (value - traj.value).clip(-config["CLIP_EPS"], config["CLIP_EPS"])
        value_loss = 0.5 * jnp.maximum((value - targets) ** 2, (value_clipped - targets) ** 2).mean()
        ratio = jnp.exp(log_prob - traj.log_prob)
        gae = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        clipped = jnp.clip(ratio, 1.0 - config["CLIP_EPS"], 1.0 + config["CLIP_EPS"]) * gae
        actor_loss = -jnp.minimum(ratio * gae, clipped).mean()
        entropy = -(jnp.exp(log_probs) * log_probs).sum(-1).mean()
        total = actor_loss + config["VF_COEF"] * value_loss - config["ENT_COEF"] * entropy
        return total, (value_loss, actor_loss, entropy)

    grad_fn = amp.scaled_value_and_grad(loss_fn, has_aux=True)

    def train(rng):
        rng, init_rng, reset_rng = jax.random.split(rng, 3)
        params = network.init(init_rng, jnp.zeros(env.observation_space(env_params).shape))
        train_state = TrainState.create(apply_fn=network.apply, params=params, tx=tx, precision="fp16")
        obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(reset_rng, config["NUM_ENVS"]),
                                                                 env_params)
        episode_return = jnp.zeros(config["NUM_ENVS"])

        def _update_step(runner_state, _):
            def _env_step(runner_state, _):
                train_state, env_state, last_obs, episode_return, rng = runner_state
                rng, action_rng, step_rng = jax.random.split(rng, 3)
                logits, value = network.apply(train_state.params, last_obs)
                action = jax.random.categorical(action_rng, logits)
                log_prob = jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, None], axis=1)[:, 0]
                obs, env_state, reward, terminated, truncated, _ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
                    jax.random.split(step_rng, config["NUM_ENVS"]), env_state, action, env_params)
                done = terminated | truncated
                episode_return = episode_return + reward
                finished = jnp.where(done, episode_return, jnp.nan)
                transition = Transition(done, action, value, reward, log_prob, last_obs, finished)
                return (train_state, env_state, obs, jnp.where(done, 0.0, episode_return), rng), transition

            runner_state, traj_batch = jax.lax.scan(_env_step, runner_state, None, config["NUM_STEPS"])
            train_state, env_state, last_obs, episode_return, rng = runner_state
            _, last_value = network.apply(train_state.params, last_obs)

            def _gae(carry, transition):
                gae, next_value = carry
                not_done = 1.0 - transition.done
                delta = transition.reward + config["GAMMA"] * next_value * not_done - transition.value
                gae = delta + config["GAMMA"] * config["GAE_LAMBDA"] * not_done * gae
                return (gae, transition.value), gae

            _, advantages = jax.lax.scan(_gae, (jnp.zeros_like(last_value), last_value), traj_batch, reverse=True)
            targets = advantages + traj_batch.value

            def _update_epoch(update_state, _):
                def _update_minibatch(state, batch):
                    (total_loss, _), grads, finite, norm, scaler = grad_fn(state, state.params, *batch)
                    state = state.apply_gradients(grads=grads, grads_finite=finite, grad_norm=norm, scaler=scaler)
                    return state, total_loss

                train_state, rng = update_state
                rng, perm_rng = jax.random.split(rng)
                permutation = jax.random.permutation(perm_rng, batch_size)
                batch = (traj_batch, advantages, targets)
                batch = jax.tree.map(lambda x: x.reshape((batch_size,) + x.shape[2:]), batch)
                minibatches = jax.tree.map(
                    lambda x: x[permutation].reshape((config["NUM_MINIBATCHES"], -1) + x.shape[1:]), batch)
                train_state, losses = jax.lax.scan(_update_minibatch, train_state, minibatches)
                return (train_state, rng), losses

            (train_state, rng), losses = jax.lax.scan(_update_epoch, (train_state, rng), None, config["UPDATE_EPOCHS"])
            metric = {"episode_return": jnp.nanmean(traj_batch.episode_return), "loss": losses.mean()}
            metric |= {"loss_scale": train_state.scaler.loss_scale, "skipped": train_state.skipped}
            return (train_state, env_state, last_obs, episode_return, rng), metric

        runner_state = (train_state, env_state, obs, episode_return, rng)
        runner_state, metrics = jax.lax.scan(_update_step, runner_state, None, num_updates)
        return {"runner_state": runner_state, "metrics": metrics}

    return train


if __name__ == "__main__":
    total = int(float(sys.argv[1])) if len(sys.argv) > 1 else CONFIG["TOTAL_TIMESTEPS"]
    out = jax.jit(make_train({"TOTAL_TIMESTEPS": total}))(jax.random.PRNGKey(0))
    returns = np.asarray(out["metrics"]["episode_return"])
    first, last = np.nanmean(returns[:10]), np.nanmean(returns[-10:])
    print(f"updates {len(returns)}  return over the first 10: {first:.1f}, over the last 10: {last:.1f}")
    print(f"skipped steps {int(out['metrics']['skipped'][-1])}  loss scale {float(out['metrics']['loss_scale'][-1]):g}")
