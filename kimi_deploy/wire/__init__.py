"""wire: see README.md, "Layout"."""
