"""End-to-end examples: `python -m flashext.examples.train_gpt`."""
