"""training: the training pipeline of gpt-serve (data, loop, checkpoints, presets, the lesson's ladder)."""
