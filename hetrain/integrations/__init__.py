"""Integrations with other tools (Lightning, Accelerate, ...); each is imported only when used."""
