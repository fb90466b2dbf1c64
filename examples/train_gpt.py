"""The same as `python -m flashext.examples.train_gpt` (flashext/examples/train_gpt.py), as a script."""

from flashext.examples.train_gpt import main

if __name__ == "__main__":
    main()
