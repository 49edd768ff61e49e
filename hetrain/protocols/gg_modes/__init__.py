"""The Group Generator's modes (``--gg``), one strategy object each behind :class:`~.base.GroupingMode`.

:class:`~hetrain.protocols.group_generator.GroupGenerator` owns what every
mode shares (the request counters, the :class:`~hetrain.protocols.ledger.GroupLedger`,
one seeded random generator) and asks its mode who forms a group on each
request. ``MODES`` maps each mode's name to its class.
"""

from __future__ import annotations

from hetrain.protocols.gg_modes.base import GroupingMode
from hetrain.protocols.gg_modes.buffer import BufferMode
from hetrain.protocols.gg_modes.division import DivisionMode
from hetrain.protocols.gg_modes.random_groups import RandomMode
from hetrain.protocols.gg_modes.smart import SmartMode
from hetrain.protocols.gg_modes.static import StaticMode

MODES: dict[str, type[GroupingMode]] = {
    mode.name: mode for mode in (RandomMode, BufferMode, DivisionMode, StaticMode, SmartMode)
}
GG_MODES = tuple(MODES)

__all__ = ["GG_MODES", "MODES", "GroupingMode"]
