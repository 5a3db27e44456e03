"""The sweep engine: the runner schedules cases over worker processes that own CUDA; each worker measures a case
(inputs, correctness, timing, memory, NVML) and every crash, hang or OOM becomes a row. `flashbench calibrate`
(calibrate.py) and `sweep --ncu` (ncu.py) measure with the same timing and worker."""
