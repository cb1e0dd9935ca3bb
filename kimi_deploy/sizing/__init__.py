"""Sizing: what SGLang will resolve on this host (:mod:`.effective`) and whether the model fits (:mod:`.memory`)."""
