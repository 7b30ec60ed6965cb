"""The on-policy update, written once for PPO and PQN (PureJaxRL's update): each update a
rollout of num-steps vector steps of num-envs environments, then update-epochs passes of
num-minibatches shuffled minibatches over it (`epochs`); its fields, with the checks that go
with them (the int32 step counters' bound among them).

>>> from genesis_jax.algos.pqn import PQNConfig
>>> config = PQNConfig(total_steps=65_536, num_envs=32, num_steps=64)
>>> config.batch_size, config.num_updates, config.minibatch_size
(2048, 32, 128)
"""

from __future__ import annotations

import dataclasses

import jax

from genesis_jax.run.config import INT32_MAX, POSITIVE, POSITIVE_INT, UNIT_INTERVAL

# The few-row run of an on-policy algorithm the generic tests train (`Presets.tiny`).
TINY = dict(
    total_steps=256, num_envs=4, num_steps=16, update_epochs=1, num_minibatches=2, hidden=(16,), eval_episodes=0
)


@dataclasses.dataclass(frozen=True)
class OnPolicyFields:
    """The rollout and its epochs of minibatches (a field group, composed with `ActingFields`)."""

    num_steps: int = 128
    """Rollout length per environment per update."""
    update_epochs: int = 4
    """Passes over each rollout."""
    num_minibatches: int = 4
    """Minibatches per pass."""
    lr: float = 2.5e-4
    """Adam's learning rate."""
    anneal_lr: bool = True
    """Decay the learning rate linearly to 0 over the run."""
    gae_lambda: float = 0.95
    """The lambda of the returns' look-ahead: GAE's (PPO), Q(lambda)'s (PQN)."""

    FIELD_BOUNDS = {name: POSITIVE_INT for name in ("num_steps", "update_epochs", "num_minibatches")}
    FIELD_BOUNDS |= {"gae_lambda": UNIT_INTERVAL, "lr": POSITIVE}

    def budget_schedules(self) -> list[str]:  # what follows total-steps (`run.config.budget_schedules`)
        return ["the learning rate's decay to 0 (anneal-lr)"] if self.anneal_lr else []

    def check(self):
        if self.batch_size > INT32_MAX:  # the rollout is indexed in int32 (jnp.nonzero's sizes, the minibatch shuffle)
            raise ValueError(
                f"num-envs x num-steps = {self.batch_size} transitions per rollout, above {INT32_MAX} (int32): "
                "fewer environments or steps"
            )
        if self.batch_size % self.num_minibatches:
            raise ValueError(
                f"num-envs x num-steps = {self.batch_size} is not divisible into {self.num_minibatches} minibatches"
            )
        if self.total_steps < self.batch_size:
            raise ValueError(
                f"total-steps {self.total_steps} is less than one rollout (num-envs x num-steps = {self.batch_size})"
            )
        steps_per_update = self.update_epochs * self.num_minibatches
        if self.num_updates * steps_per_update > INT32_MAX:  # optax and TrainState count steps in int32
            raise ValueError(
                f"total-steps {self.total_steps} would take {self.num_updates * steps_per_update} optimizer steps, "
                f"but the step counters are int32: at most {INT32_MAX // steps_per_update * self.batch_size} "
                f"total-steps with num-envs x num-steps = {self.batch_size} and update-epochs x num-minibatches = "
                f"{steps_per_update}"
            )

    @property
    def batch_size(self) -> int:
        """Transitions per update: num-envs x num-steps."""
        return self.num_envs * self.num_steps

    @property
    def minibatch_size(self) -> int:
        return self.batch_size // self.num_minibatches

    @property
    def num_updates(self) -> int:
        return self.total_steps // self.batch_size

    @property
    def steps_run(self) -> int:
        """The environment steps (one seed's) the run takes: whole rollouts."""
        return self.num_updates * self.batch_size

    def epochs(self, step, train_state, data, key):
        """update-epochs passes over `data` (leaves [batch-size, ...]), each in num-minibatches
        shuffled minibatches through `step(train_state, minibatch) -> (train_state, out)`: the
        train state after them, and the outs [update-epochs, num-minibatches, ...]."""

        def epoch(train_state, key):
            order = jax.random.permutation(key, self.batch_size)
            minibatches = jax.tree.map(lambda x: x[order].reshape(self.num_minibatches, -1, *x.shape[1:]), data)
            return jax.lax.scan(step, train_state, minibatches)

        return jax.lax.scan(epoch, train_state, jax.random.split(key, self.update_epochs))
