"""Judging a model: language and number metrics (`evaluation`), the baselines every number forecaster is
compared with (`baselines`), PNG figures (`plots`), the next-step view of what the model would decide after a
text (`predict`), the end-to-end demo that converts, verifies, fine-tunes and evaluates a tiny model on
the embedded Seattle-weather table (`demo`), and how many positions a pass over the whole vocabulary takes at a
time (`row_blocks`, also read by the conversion's calibration and comparison).
"""
