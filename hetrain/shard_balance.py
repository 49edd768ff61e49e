"""Every shard sampled at the same rate while the workers run at different speeds (``--data-split balanced``).

Each worker owns a shard (its ``rank::world`` slice). A worker that is always
slow samples its own shard at its own slow rate, so its data is under-trained
and the job's model drifts toward the fast workers' shards (docs/decisions/hop-uses-late-updates.md,
"The straggler's shard"). Here a shard is *in deficit* when its owner's rate
(batches per second) is below the fair rate R / n (R: all workers' rates
together); every worker above the fair rate gives part of its batches to the
shards in deficit, in proportion to its surplus, and each shard in deficit gets
them in proportion to its deficit. Then every shard's rate is the fair rate:
the owner's own plus what the others give it. Worker i samples

* its own shard with probability ``1 - give_i / r_i`` and
* shard j (in deficit) with probability ``give_i / r_i * d_j / D``,

where ``d_j = fair - r_j``, ``D = sum(d_j)``, ``s_i = r_i - fair`` (its surplus),
``S = sum(s_i)`` and ``give_i = D * s_i / S`` (so the fast workers give D in all).
A shard counts as in deficit only below ``(1 - DEAD_BAND)`` times the fair
rate: at equal speeds (jitter of a few percent, or DDP's lockstep) every
worker samples its own shard alone, exactly as ``shard``. A dead worker's rate
is 0, so the live workers take over its whole shard.

Pure: the rates come from :class:`hetrain.jobs.rate_board.RateBoard`.
"""

from __future__ import annotations

import torch

DEAD_BAND = 0.1  # a shard sampled at >= 90% of the fair rate is left to its owner


def shard_mix(rates: list[float], rank: int, dead_band: float = DEAD_BAND) -> dict[int, float]:
    """Worker ``rank``'s probability of drawing its next batch from each shard, for the workers' ``rates``."""
    total = sum(rates)
    if total <= 0 or len(rates) < 2:
        return {rank: 1.0}
    fair = total / len(rates)
    deficits = {j: fair - r for j, r in enumerate(rates) if r < (1.0 - dead_band) * fair}
    own = rates[rank]
    if not deficits or own <= fair:
        return {rank: 1.0}
    surplus = sum(r - fair for r in rates if r > fair)
    give = sum(deficits.values()) * (own - fair) / surplus / own  # the share of this worker's batches given
    mix = {rank: 1.0 - give}
    deficit = sum(deficits.values())
    for j, d in deficits.items():
        mix[j] = mix.get(j, 0.0) + give * d / deficit
    return mix


class BalancedSampler:
    """Batches from this worker's own shard, and from the shards in deficit as :func:`shard_mix` says.

    ``shard_sampler(j, seed)`` builds an endless sampler of shard ``j`` whose generator is seeded with
    ``seed``; the own shard's sampler is the one ``shard`` would use (same seed), so with the mix at
    ``{rank: 1}`` the batches are exactly ``shard``'s. Which shard each batch comes from is drawn by a
    generator of its own (seeded from the run's seed and the rank).
    """

    def __init__(self, shard_sampler, rank: int, world_size: int, seed: int):
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self._make = shard_sampler
        self.samplers = {rank: shard_sampler(rank, seed * 1_000_003 + rank)}
        self.mix = {rank: 1.0}
        self.chooser = torch.Generator().manual_seed(seed * 1_000_003 + world_size * 7_919 + rank)
        self.drawn = [0] * world_size  # batches taken from each shard (metrics, tests)

    def set_rates(self, rates: list[float]) -> None:
        self.mix = shard_mix(rates, self.rank)

    def _shard_for_next(self) -> int:
        if len(self.mix) == 1:
            return next(iter(self.mix))
        shards = list(self.mix)
        weights = torch.tensor([self.mix[j] for j in shards], dtype=torch.float64)
        return shards[int(torch.multinomial(weights, 1, generator=self.chooser))]

    def _sampler(self, shard: int):
        if shard not in self.samplers:  # a borrowed shard: this worker's own order of it
            self.samplers[shard] = self._make(shard, (self.seed * 1_000_003 + self.rank) * 1_009 + shard + 1)
        return self.samplers[shard]

    def next(self):
        shard = self._shard_for_next()
        self.drawn[shard] += 1
        return self._sampler(shard).next()

    def state_dict(self) -> dict:
        return {"balanced": True, "chooser": self.chooser.get_state(), "drawn": list(self.drawn),
                "samplers": {j: s.state_dict() for j, s in self.samplers.items()}}

    def load_state_dict(self, state: dict) -> None:
        if not state.get("balanced"):  # a checkpoint of a plain shard sampler: this worker's own shard
            self.samplers[self.rank].load_state_dict(state)
            return
        self.chooser.set_state(state["chooser"])
        self.drawn = list(state["drawn"])
        for j, saved in state["samplers"].items():
            self._sampler(int(j)).load_state_dict(saved)
