"""Things done to and with a serving host: restart gate tiers, upgrade, cold-start phases."""
