"""Integrations with libraries that call attention for their users: `flashext.integrations.transformers`.
Each is imported on demand only (`import flashext` never imports them)."""
