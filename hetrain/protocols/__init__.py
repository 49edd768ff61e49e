"""Pure protocol logic: what to send, what to wait for, when to average.

Nothing here does I/O or touches torch.distributed; the runtime
(``hetrain.runtime``) and the simulator (``hetrain.sim``) drive the same code.
"""
