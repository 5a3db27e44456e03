"""Data-only package: the GPU spec table, model presets, sweep presets and gate thresholds (TOML).

Installed as ``flashbench.configs`` so the tables travel with a non-editable install; read them through
``flashbench.configfiles``.
"""
