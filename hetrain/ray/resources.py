"""``--ray-worker-resources``: what each worker's actor reserves, as ``NAME=AMOUNT[,NAME=AMOUNT...]``."""

from __future__ import annotations

from hetrain.errors import UsageError

DEFAULT_RESOURCES = {"CPU": 1.0}
FLAG = "--ray-worker-resources"


def parse_resources(text: str | None) -> dict[str, float]:
    """``CPU=2,GPU=1,A100=1`` -> {"CPU": 2.0, "GPU": 1.0, "A100": 1.0} (Ray's resource names: CPU, GPU,
    memory in bytes, or a custom resource a node declares, e.g. an accelerator type). CPU is 1 unless
    given; a zero amount reserves nothing. UsageError for anything else."""
    if text is None or not text.strip():
        return dict(DEFAULT_RESOURCES)
    resources: dict[str, float] = {}
    for item in text.split(","):
        name, sep, amount = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise UsageError(f"{FLAG}: {item.strip()!r} is not NAME=AMOUNT (e.g. CPU=1,GPU=1)")
        try:
            value = float(amount)
        except ValueError:
            raise UsageError(f"{FLAG}: the amount of {name} must be a number, got {amount.strip()!r}") from None
        if not value >= 0 or value == float("inf"):
            raise UsageError(f"{FLAG}: the amount of {name} must be a finite number >= 0, got {amount.strip()!r}")
        if name in resources:
            raise UsageError(f"{FLAG} names {name} twice")
        resources[name] = value
    if "CPU" not in resources:
        resources["CPU"] = DEFAULT_RESOURCES["CPU"]
    kept = {name: value for name, value in resources.items() if value > 0}
    if not kept:
        raise UsageError(f"{FLAG} reserves nothing; give each worker at least some CPU, GPU or custom resource")
    return kept
