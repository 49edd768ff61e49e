"""The checks of a run's configuration that need no worker, no data and no torch.

``hetrain train`` runs them before it starts anything (the warm server included), so bad input is a
one-line error in well under a second; :func:`hetrain.jobs.run.check_run_config` runs them too, then
the checks that need torch (the devices, the model's size against ``--comm-memory-mb``).
"""

from __future__ import annotations

from hetrain.config import RunConfig
from hetrain.faults import parse_fail
from hetrain.loggers.scalar_writers import check_log_packages
from hetrain.protocols.options import OptionError
from hetrain.slowdown import parse_slowdown


def check_before_start(config: RunConfig) -> RunConfig:
    """Raise UsageError (exit 2 from the CLI) for what is wrong in ``config`` alone."""
    config.validate()
    check_log_packages(config.log)
    check_checkpoint_kills(config)
    parse_slowdown(config.slowdown, config.seed).check_workers(config.num_workers)
    return config


def check_checkpoint_kills(config: RunConfig) -> None:
    """A run's ``--fail W@checkpoint`` kills a worker as it writes a checkpoint while training: refused on a
    run that writes none (the kill could never fire, and the run said nothing)."""
    events = parse_fail(config.fail, config.seed).events
    if any(f.phase == "checkpoint" for f in events) and not (config.checkpoint_dir and config.checkpoint_every_s):
        raise OptionError("{fail} W@checkpoint kills a worker as it writes a checkpoint while training, and this "
                          "run writes none: add {checkpoint_dir} DIR {checkpoint_every_s} SECONDS")
