"""Prague: P-Reduce, the Group Generator, and the prague / adpsgd / ps protocols."""

from hetrain.prague.group_generator import GG_MODES, GroupGenerator, static_schedule
from hetrain.prague.ledger import Group
from hetrain.prague.preduce import PReduce

__all__ = ["GG_MODES", "Group", "GroupGenerator", "PReduce", "static_schedule"]
