"""How the Ray tests' nodes are started: on loopback, with a small object store (tests/ray/conftest.py)."""

OBJECT_STORE_BYTES = 80 * 2**20


def node_args(num_cpus: int, **extra) -> dict:
    return dict(node_ip_address="127.0.0.1", num_cpus=num_cpus, object_store_memory=OBJECT_STORE_BYTES, **extra)


def train_command(address: str, out, *flags: str) -> list[str]:
    """``hetrain train`` on the Ray cluster at ``address`` with 2 workers, its record under ``out``."""
    import sys

    return [sys.executable, "-m", "hetrain", "train", "--launcher", "ray", "--ray-address", address,
            "--workers", "2", *flags, "--out", str(out)]
