"""MLflow logging for rlcore: ``[trainer] loggers = ["console", "jsonl", "mlflow"]``."""
