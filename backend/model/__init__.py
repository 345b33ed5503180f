"""The torch side: the Llama decoder, its loaders and the tokenizer."""
