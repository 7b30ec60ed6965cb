import os

# Tests run on CPU with float32 matmuls at full precision, in one process per suite.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.pop("GENESIS_PRECISION", None)
os.environ.pop("ENABLE_FP16_TRAINING", None)
