"""Variants in turns: one sweep run several times, the providers' order reversed every other round.

A study sweep (`order = "case"`) times a shape's variants back to back, once. Two variants a few percent apart
need more: the same comparison repeated, each variant first as often as second, so that a drift of the clock or
the temperature over the run cannot pass for a difference (docs/measuring.md, "Order"). This runs `flashbench
sweep` `--rounds` times, each a process of its own into DIR/round-R, with `--providers` in the order given in odd
rounds and reversed in even ones, then prints per shape each provider's median per round and its time over the
first provider's, round by round (min..max): the figure docs/kernels.md quotes as "in turns".

    python benchmarks/turns.py --rounds 3 --out RUN -- --config benchmarks/studies/fp8_forward.toml \\
        --head-dim 128 --seq 2048 --causal true --dtype fp8 --providers fp8-ws-s3-lpt-h4,fp8-ws-s3-lpt-h8
    python benchmarks/turns.py --summary RUN          # the table again, from the rounds on disk

Everything after `--` goes to `flashbench sweep` as it is, `--providers` (two or more) included; `--out` is the
script's. The exit status is the first failing sweep's (its rows so far are kept), else 0.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

ROUND = "round-"


def providers_of(sweep_args: list[str]) -> tuple[list[str], int]:
    """The providers named by the sweep's `--providers A,B` (or `--providers=A,B`) and that argument's index."""
    for i, arg in enumerate(sweep_args):
        if arg == "--providers" and i + 1 < len(sweep_args):
            return [p for p in sweep_args[i + 1].split(",") if p], i
        if arg.startswith("--providers="):
            return [p for p in arg.split("=", 1)[1].split(",") if p], i
    return [], -1


def round_order(providers: list[str], round_no: int) -> list[str]:
    """Round 1, 3, ...: the order given; round 2, 4, ...: reversed."""
    return list(providers) if round_no % 2 else list(reversed(providers))


def sweep_command(sweep_args: list[str], providers: list[str], at: int, out: Path) -> list[str]:
    """`flashbench sweep` with this round's provider order and output folder (sweep_args' own --providers
    replaced in place)."""
    args = list(sweep_args)
    if args[at] == "--providers":
        args[at + 1] = ",".join(providers)
    else:
        args[at] = "--providers=" + ",".join(providers)
    return [sys.executable, "-m", "flashbench", "sweep", *args, "--out", str(out)]


def summary(run: Path) -> str:
    """A markdown table per shape: provider, median ms per round, time over the first provider's per round."""
    from flashbench.results.rows import read_rows

    rounds = sorted((p for p in run.glob(ROUND + "*") if p.is_dir()), key=lambda p: int(p.name[len(ROUND) :]))
    if not rounds:
        raise SystemExit(f"{run}: no {ROUND}N folders")
    times: dict[str, dict[str, list[float | None]]] = {}  # shape -> provider -> median ms per round
    order: list[str] = []
    for r, folder in enumerate(rounds):
        for row in read_rows(folder):
            by_provider = times.setdefault(row.case.shape_key, {})
            medians = by_provider.setdefault(row.provider, [None] * len(rounds))
            medians[r] = row.median_ms if row.status == "ok" else None
            if r == 0 and row.provider not in order:
                order.append(row.provider)
    lines = []
    for shape, per in times.items():
        names = [p for p in order if p in per] + [p for p in per if p not in order]
        first = per[names[0]]
        lines += [
            f"{shape.replace('|', ' ')}",
            "",
            "| provider | ms per round | x the first |",
            "| --- | --- | --- |",
        ]
        for name in names:
            ms = per[name]
            cells = " / ".join("-" if t is None else f"{t:.4f}" for t in ms)
            ratios = [t / f for t, f in zip(ms, first, strict=True) if t is not None and f]
            span = f"{min(ratios):.3f}..{max(ratios):.3f}" if ratios else "-"
            med = statistics.median(ratios) if ratios else None
            lines.append(f"| {name} | {cells} | {span}" + (f" (median {med:.3f})" if med else "") + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="sweeps in turns (default 3)")
    parser.add_argument("--out", type=Path, help="the folder of the rounds (DIR/round-1, ...)")
    parser.add_argument(
        "--summary", type=Path, metavar="RUN", help="print the table of rounds on disk and exit"
    )
    args = parser.parse_args(argv[:split])
    if args.summary:
        print(summary(args.summary))
        return
    sweep_args = argv[split + 1 :]
    providers, at = providers_of(sweep_args)
    if len(providers) < 2 or args.out is None or args.rounds < 1:
        parser.error("give --out DIR, --rounds >= 1 and, after --, a sweep with --providers A,B[,...]")
    for r in range(1, args.rounds + 1):
        cmd = sweep_command(sweep_args, round_order(providers, r), at, args.out / f"{ROUND}{r}")
        print(f"round {r}: {' '.join(cmd[3:])}", flush=True)
        done = subprocess.run(cmd, check=False)
        if done.returncode:
            print(summary(args.out))
            raise SystemExit(done.returncode)
    print(summary(args.out))


if __name__ == "__main__":
    main()
