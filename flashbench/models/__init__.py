"""Pure models (no torch import): FLOPs, HBM bytes, memory, roofline. Numbers in, numbers out."""
