"""host: see README.md, "Layout"."""
