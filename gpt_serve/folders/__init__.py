"""Model folders: import, checkpoints, corpus records, publishing."""
