"""Weights & Biases logging for rlcore: ``[trainer] loggers = ["console", "jsonl", "wandb"]``."""
