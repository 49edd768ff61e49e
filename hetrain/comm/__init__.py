"""Communication settings shared by the runtime and the simulator (pure: no torch).

:mod:`~hetrain.transport.link_spec` (an emulated network), :mod:`~hetrain.compression.spec`
(what a message is compressed to), :mod:`~hetrain.comm.local_work` (local steps between
exchanges) and :mod:`~hetrain.comm.settings` (the one object that carries them).
"""
