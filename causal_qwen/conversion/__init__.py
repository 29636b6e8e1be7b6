"""From a Qwen2 base to a CausalQwen model, and finding the model a name stands for: loading bases (hub id,
folder, ``.gguf`` file) and the initialisation table (`conversion`), the thresholds and decision scales fitted
to the base's own logits (`calibration`), the offline ``random:*`` bases (`presets`), where a model runs and in
which precision (`devices`), and resolving a name on the command line or in a config to a base
to convert or a saved CausalQwen folder, with damaged-weight checks and at-once failures for unreachable hub
ids (`loading`, `hub`). None of it travels with a saved model; it needs the installed package.
"""
