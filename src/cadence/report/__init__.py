"""Reports of runs: comparison tables and time-to-accuracy plots."""
