"""An example third-party rlcore engine: plain PyTorch, one full model replica per rank.

Written from the README's "Writing a plugin" and :mod:`rlcore.interfaces` only; select it
with ``[actor.engine] name = "torch"``.
"""
