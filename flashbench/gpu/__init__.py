"""Facts about the GPU: NVML readings, the spec table and derived/calibrated ceilings, the environment record.
What measures the GPU (calibrate, Nsight Compute byte counts) runs through the engine's timing and worker:
engine/calibrate.py, engine/ncu.py."""
