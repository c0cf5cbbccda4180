"""The main command: ``python -m benchmarks --suite quick`` checks and times every variant vs cuDNN."""
