"""What the kit knows about the models it deploys: one table of facts per model, each with its source
(:mod:`.models`), and the presets built from it (:mod:`.presets`)."""
