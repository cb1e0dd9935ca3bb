"""Things done to or with a host: the restart gate's tiers, SGLang upgrades, cold-start phases."""
