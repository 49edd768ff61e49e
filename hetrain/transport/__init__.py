"""The wire: how a worker reaches the others (no protocol logic here).

:mod:`~hetrain.transport.job` (a protocol's view of its job: group, store, device, timeout),
:mod:`~hetrain.transport.peer_channels` (tagged point-to-point messages to neighbours) over
:mod:`~hetrain.transport.pair_links` and :mod:`~hetrain.transport.data_plane`, with
:mod:`~hetrain.transport.send_window` (bounded sends in flight), :mod:`~hetrain.transport.buffer_pool`
(recycled buffers), :mod:`~hetrain.transport.device_thread` and :mod:`~hetrain.transport.watched_call`
(helper threads and waits that give up on a death), and the emulated network:
:mod:`~hetrain.transport.link_spec` (pure: no torch) and :mod:`~hetrain.transport.link` (one worker's link).
Importing the package imports nothing (the pure spec stays importable without torch).
"""
