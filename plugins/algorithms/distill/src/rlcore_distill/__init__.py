"""On-policy distillation (GKD, arXiv 2306.13649; Thinking Machines' on-policy distillation) as
an rlcore algorithm plugin, written against the public API only."""
