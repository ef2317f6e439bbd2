"""What a stage's plan reads: the typed planning context, the inputs and their fingerprints, the tokenizer."""
