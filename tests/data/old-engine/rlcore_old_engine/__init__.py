"""An rlcore engine plugin as it was written for plugin contract 1 (see ``engine.py``)."""
