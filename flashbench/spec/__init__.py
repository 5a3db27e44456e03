"""What to measure: the frozen Case record, sweep specs from TOML presets and flags, and the plan (spec -> cases)."""
