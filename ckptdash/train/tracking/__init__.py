"""The experiment loggers (TensorBoard, W&B, MLflow, CSV) see one run across attempts.

The rule and its files (loggers), ``Monitor.loggers`` for loops that open their own
(logger_runs), and the Hugging Face Trainer's ``report_to`` loggers (hf_loggers).
"""
