"""Issue 7's tables from a `flashbench sweep --preset speed` run: the bundled kernel's TFLOP/s beside SDPA
flash and cuDNN, the two ratios, and whether each target holds (ratios of medians measured in the same run).

    python benchmarks/speed_tables.py results/examples/h100-speed
"""

from __future__ import annotations

import argparse

import flashbench

# (head_dim, mode) -> (min ratio to sdpa-flash, from N, min ratio to sdpa-cudnn or None, from N)
TARGETS = {
    (128, "fwd"): (1.5, 2048, 0.9, 4096),
    (64, "fwd"): (1.4, 2048, 0.95, 4096),
    (128, "fwd+bwd"): (1.3, 2048, None, 0),
    (64, "fwd+bwd"): (1.2, 2048, None, 0),
}


def mark(ratio: float, need: float | None, n: int, from_n: int) -> str:
    if need is None or n < from_n:
        return f"{ratio:.2f}"
    return f"{ratio:.2f} {'✓' if ratio >= need else '✗'}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir")
    args = ap.parse_args()
    df = flashbench.load(args.run_dir)
    df = df[df.status == "ok"]
    met = missed = 0
    for (d, mode), (f_need, f_from, c_need, c_from) in TARGETS.items():
        for causal in (False, True):
            sel = df[(df.head_dim == d) & (df["mode"] == mode) & (df.causal == causal)]
            piv = sel.pivot_table(index="seq_q", columns="provider", values="tflops")
            print(f"\n**d={d}, {'causal' if causal else 'non-causal'}, {mode}** (TFLOP/s, median; targets: "
                  f">= {f_need}x sdpa-flash from N={f_from}"
                  + (f", >= {c_need}x sdpa-cudnn from N={c_from}" if c_need else "") + ")\n")  # fmt: skip
            print("| N | triton | sdpa-flash | sdpa-cudnn | triton / flash | triton / cuDNN |")
            print("| ---: | ---: | ---: | ---: | ---: | ---: |")
            for n, r in piv.iterrows():
                rf, rc = r["triton"] / r["sdpa-flash"], r["triton"] / r["sdpa-cudnn"]
                for ratio, need, start in ((rf, f_need, f_from), (rc, c_need, c_from)):
                    if need is not None and n >= start:
                        met, missed = (met + 1, missed) if ratio >= need else (met, missed + 1)
                print(
                    f"| {n} | {r['triton']:.1f} | {r['sdpa-flash']:.1f} | {r['sdpa-cudnn']:.1f} "
                    f"| {mark(rf, f_need, n, f_from)} | {mark(rc, c_need, n, c_from)} |"
                )
    print(f"\nTarget cells met: {met} of {met + missed}.")


if __name__ == "__main__":
    main()
