"""Fine-tuning with `transformers.Trainer`: documents read from JSON Lines, text and CSV tables with their
train/validation split (`data`), tokenized with their numbers and padded into batches (`collator`), the
settings of ``causal-qwen train`` (`train_config`), learning-rate groups, freezing and per-part gradient norms
(`parameter_groups`), the figures logged each step to ``metrics.jsonl`` (`monitoring`), the run itself
(`training`), the number read-out's steps around it: the check slice, the warm start's report, the checks and
refits before the save (`readout_steps`; the checks in `interval_check` and `location_check`, the fits in
`warm_start`) and its output folder: one run at a time, complete checkpoints only, what ``--resume`` continues
from (`run_folder`). Evaluation reads its documents through `data` and `collator` too.
"""
