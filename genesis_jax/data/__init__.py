"""Data for the algorithms, below them: replay buffers (`data.replay`, flashbax) and trajectory
datasets (`data.trajectories`: the `.npz` files `genesis-jax collect` writes, read, checked and
collected from an environment)."""
