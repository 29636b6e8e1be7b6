"""Judging a model: language and number metrics (`evaluation`), the baselines every number forecaster is
compared with (`baselines`), PNG figures (`plots`), the next-step view of what the model would decide after a
text (`predict`), the end-to-end demo that converts, verifies, fine-tunes and evaluates a tiny model on
the embedded Seattle-weather table (`demo`), and the report verifying a conversion against its base (`compare`).
"""
