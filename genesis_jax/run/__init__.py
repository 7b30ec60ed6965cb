"""The run layer: what every algorithm's run does around its compiled steps (run directory,
checkpoints and resume, metric writers, progress, signals, several devices and processes)."""
