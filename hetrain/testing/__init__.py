"""Helpers for hetrain's own tests (shipped, like ``torch.testing``); nothing here runs unless asked."""
