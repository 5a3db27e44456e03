"""The providers flashbench ships, and what the rest of flashbench reads from their declarations.

Importing this module registers the torch baselines and the bundled kernels (neither imports torch until a
worker builds a case). The questions below read the registry as it stands (builtins and any provider registered
since), so a provider's declaration is the one place its model family, its baseline rank, its gate ratio, its
colour and its package are written.
"""

from __future__ import annotations

from flashbench.providers import bundled, torch_baselines  # noqa: F401  (registering is importing them)
from flashbench.providers.registry import ProviderInfo, family_of, providers

# Always in the environment record, whichever providers ran: what flashbench itself reads the GPU and rows with.
TOOL_PACKAGES = ("nvidia-ml-py", "pandas")

__all__ = ["TOOL_PACKAGES", "baselines", "colours", "family_of", "infos", "load", "packages", "ratio_pairs"]


def load() -> None:
    """Register the built-in providers: done by importing this module, so this only names the act for callers."""


def infos() -> list[ProviderInfo]:
    return [p.info for p in providers()]


def baselines() -> tuple[str, ...]:
    """The default speedup references, in the order their declared `baseline` ranks give."""
    ranked = sorted((i.baseline, n, i.name) for n, i in enumerate(infos()) if i.baseline is not None)
    return tuple(name for _, _, name in ranked)


def ratio_pairs() -> tuple[tuple[str, str], ...]:
    """(provider, reference) for every provider that declares the reference of its in-run ratio (the gate's)."""
    return tuple((i.name, i.ratio_vs) for i in infos() if i.ratio_vs is not None)


def colours() -> dict[str, str]:
    """The declared colour of every provider that declares one."""
    return {i.name: i.colour for i in infos() if i.colour is not None}


def packages() -> tuple[str, ...]:
    """The distributions the environment record lists: the providers', then flashbench's own readers."""
    declared = (i.package for i in infos() if i.package is not None)
    return tuple(dict.fromkeys((*declared, *TOOL_PACKAGES)))
