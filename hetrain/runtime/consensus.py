"""Final model consensus over the whole group, shared by every protocol's ``finish``."""

from __future__ import annotations

import torch
import torch.distributed as dist

from hetrain.errors import WorkerError
from hetrain.runtime.flat_state import FlatState
from hetrain.runtime.job import JobView


def average_state(state: FlatState, job: JobView) -> float:
    """Replace every worker's model by the group-wide average; return the consensus distance.

    Consensus distance = sqrt(mean_i ||x_i - mean_x||^2), measured before averaging
    (0 when all workers already agree). A collective: every worker must call it.
    """
    if job.world_size == 1:
        return 0.0
    try:
        mean = state.gather()
        dist.all_reduce(mean, group=job.group, async_op=True).wait(timeout=job.timeout)
        mean /= job.world_size
        own = state.gather().sub_(mean)  # x_i - mean, in place: one model-sized buffer, not four
        spread = torch.tensor([float(torch.linalg.vector_norm(own)) ** 2], dtype=torch.float64, device=mean.device)
        del own
        dist.all_reduce(spread, group=job.group, async_op=True).wait(timeout=job.timeout)
    except Exception as exc:
        raise WorkerError(f"worker {job.rank} waited for the final average over all {job.world_size} workers: "
                          f"{str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}") from None
    state.scatter(mean)
    return float(torch.sqrt(spread / job.world_size).item())
