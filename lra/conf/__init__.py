"""The Hydra configuration of ``python -m lra.train``, shipped with the package (``lra.config`` composes it)."""
