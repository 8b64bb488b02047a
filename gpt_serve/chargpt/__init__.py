"""The transformers model of the lesson: config, model, char tokenizer, window, vocabulary."""
