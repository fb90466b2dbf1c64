"""Integrations with what calls attention for its users: `flashext.integrations.sdpa` (PyTorch's
flash-attention registry; torch only, registered by `import flashext`, never activated by it) and
`flashext.integrations.transformers` (imported on demand only: `import flashext` never imports
transformers)."""
