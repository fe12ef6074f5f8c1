"""The trainer, its checkpoints and the run directory."""
