"""Group services: averaging inside a group of workers, and who forms the groups.

:mod:`~hetrain.groups.preduce` (P-Reduce: a group averages a flat buffer; a bounded communicator
cache), :mod:`~hetrain.groups.background_average` (a step's averages on a thread while the next step
computes), :mod:`~hetrain.groups.gg_service` (a Group Generator or AD-PSGD's pairing served to a real
job) and :mod:`~hetrain.groups.gg_prefetch` (ask for the next groups before the compute ends).
"""
