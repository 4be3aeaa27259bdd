"""The language-model trainer: GPT with CompleteP, AdamW groups, data, and the loop that reports (t̂, loss)."""
