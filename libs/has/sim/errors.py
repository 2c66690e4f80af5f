"""The simulator's error and its optional dependencies.

``SimError``: the simulation cannot run as asked (an unknown GPU type in the cluster, a policy
that broke a rule, a missing optional package), said so the user knows what to change. Pure:
``require`` only imports.
"""

from __future__ import annotations


class SimError(ValueError):
    """The simulation cannot run (unknown GPU type in the cluster, a policy broke a rule)."""


# The simulator's optional dependencies (`pip install 'frenzy[sim]'`): HiGHS for the Sia ILP and
# the Gavel LPs, matplotlib for the plots. The rest of the simulator needs neither.
SIM_EXTRA = {"highspy": "the sia and gavel policies (HiGHS solver)", "matplotlib": "the plots (--out)"}


def require(module: str) -> object:
    """Import one of the simulator's optional dependencies, or a SimError naming the extra."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise SimError(f"{module} is needed for {SIM_EXTRA.get(module, 'this')}: pip install 'frenzy[sim]'") from exc
