"""Results on disk: rows and the environment record (append-only, resumable), baselines, merging shards."""
