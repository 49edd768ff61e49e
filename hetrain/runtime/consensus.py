"""Final model consensus over the whole job, shared by every protocol's ``finish``."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from hetrain.runtime.protocol import flat_parameters, load_flat_parameters


def average_models(model: nn.Module, world_size: int, timeout_s: float) -> float:
    """Replace every worker's model by the job-wide average; return the consensus distance.

    Consensus distance = sqrt(mean_i ||x_i - mean_x||^2), measured before averaging
    (0 when all workers already agree). A collective: every worker must call it.
    """
    import datetime

    timeout = datetime.timedelta(seconds=timeout_s)
    mean = flat_parameters(model)
    dist.all_reduce(mean, async_op=True).wait(timeout=timeout)
    mean /= world_size
    own = flat_parameters(model).sub_(mean)  # x_i - mean, in place: one model-sized buffer, not four
    spread = torch.tensor([float(torch.linalg.vector_norm(own)) ** 2], dtype=torch.float64, device=mean.device)
    del own
    dist.all_reduce(spread, async_op=True).wait(timeout=timeout)
    load_flat_parameters(model, mean)
    return float(torch.sqrt(spread / world_size).item())
