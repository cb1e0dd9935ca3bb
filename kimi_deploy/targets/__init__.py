"""targets: see README.md, "Layout"."""
