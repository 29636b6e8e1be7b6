"""Fine-tuning with `transformers.Trainer`: documents read from JSON Lines, text and CSV tables with their
train/validation split (`data`), tokenized with their numbers and padded into batches (`collator`), the
settings of ``causal-qwen train`` (`train_config`), learning-rate groups, freezing and per-part gradient norms
(`parameter_groups`), the figures logged each step to ``metrics.jsonl`` (`monitoring`), the run itself
(`training`) and its output folder: one run at a time, complete checkpoints only, what ``--resume`` continues
from (`run_folder`). Evaluation reads its documents through `data` and `collator` too.
"""
