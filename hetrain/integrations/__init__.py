"""Framework adapters (Lightning's strategy, Accelerate's ``HetrainSync``); each is imported only when used.

Logging sinks live in :mod:`hetrain.loggers`; nothing below this package imports it.
"""
