"""Facts about the GPU: NVML readings, the spec table and derived/calibrated ceilings, the environment record,
Nsight Compute byte counts."""
