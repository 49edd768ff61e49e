"""What the warm server (:mod:`hetrain.jobs.warm_start`) imports once, before it forks any worker.

Everything a worker of ``hetrain train`` needs, and nothing it does not: no
scikit-learn (the launcher loads the data and hands it over), matplotlib or
progress bar. The server stays single-threaded: numpy's OpenBLAS would start a
thread at import, so it is limited to one before numpy loads. Nothing here
touches CUDA or makes a process group.

When the launcher exits, the server's pipe to it closes and the server leaves
(SystemExit); it then skips finalizing torch's modules (0.5 s and more here),
since until it is gone it holds the launcher's stdout and stderr open, and a
``hetrain train | tee log`` would wait for it.
"""

import atexit
import os
import signal
import sys

_SERVER = os.environ.pop("HETRAIN_WARM_SERVER", None) == "1"  # hetrain.jobs.warm_start.SERVER_ENV: the server only
if _SERVER:
    # A SIGTERM to the whole job (systemd, Slurm's scancel) asks the launcher to stop the workers
    # (hetrain.jobs.interrupts); it must not take the server, and with it every worker (they die with their
    # parent). So it is ignored from here, before the imports' seconds. The launcher started the server
    # with SIGTERM blocked (hetrain.jobs.warm_start.start_early), so one sent in the interpreter's start-up,
    # before this line, waited blocked and is dropped here. The server still leaves when the launcher does
    # (its pipe closes). multiprocessing's forkserver ignores SIGINT itself.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # its workers inherit an open mask

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch._dynamo  # noqa: E402, F401  (torch.optim's first optimizer imports it: 1.3 s)
import torch.distributed  # noqa: E402, F401
import torch.nn.parallel  # noqa: E402, F401

import hetrain.jobs.train_worker  # noqa: E402, F401
import hetrain.lm  # noqa: E402, F401
from hetrain.registry import PROTOCOLS  # noqa: E402

for _spec in PROTOCOLS.values():
    _spec.runtime_class()


def _leave_quickly() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if _SERVER:
    atexit.register(_leave_quickly)
