"""Drop-in APIs of other attention libraries on flashext's kernels: `flashext.compat.flash_attn`."""
