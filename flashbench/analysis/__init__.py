"""Rows joined with the models: tidy pandas frames (speedups, % of roofline, bytes/s, recompute), run comparison."""
