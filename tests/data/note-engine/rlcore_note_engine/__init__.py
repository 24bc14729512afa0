"""An rlcore engine plugin that followed only the 1 -> 2 note of forward_backward (see ``engine.py``)."""
