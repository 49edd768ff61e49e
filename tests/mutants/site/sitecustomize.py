"""Apply ``$HETRAIN_MUTANT`` as this interpreter starts (tests only; see tests/mutants/catalog.py).

Python imports ``sitecustomize`` from ``sys.path`` at start-up; the mutant meta-test puts this folder on
``PYTHONPATH``, which every process of the run inherits: local workers and their warm server, the
``hetrain`` command, torchrun's ranks, the raylets and Ray's actors. Without the variable it does nothing.
"""

import os
import sys

if os.environ.get("HETRAIN_MUTANT"):
    sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/mutants: catalog
    from catalog import apply_from_env

    apply_from_env()
