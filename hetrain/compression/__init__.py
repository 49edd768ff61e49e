"""Compressed messages: what a model message is compressed to, and how nothing is lost.

:mod:`~hetrain.compression.spec` (pure: the ``--compress`` spec, no torch),
:mod:`~hetrain.compression.codecs` (compressors of a flat buffer into one uint8 tensor),
:mod:`~hetrain.compression.error_feedback`, :mod:`~hetrain.compression.gossip_codec` (CHOCO-SGD's
public copies for gossip) and :mod:`~hetrain.compression.preduce_compressed` (the same per member set
of a P-Reduce). Importing the package imports nothing.
"""
