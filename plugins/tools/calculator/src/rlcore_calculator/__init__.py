"""rlcore-calculator: the ``calculator`` tool and the ``gsm8k_tool`` reward (its environment)."""
