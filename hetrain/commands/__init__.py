"""Sub-commands of the ``hetrain`` CLI (see hetrain.cli)."""
