"""Error feedback: what a compressor drops from a message is added to the next one (nothing is lost).

    feedback = ErrorFeedback(make_codec("topk:0.01", numel))
    payload, sent = feedback.encode(delta)     # sent = decode(payload); the rest waits in .residual

After T messages, the sum of what was sent plus the residual equals the sum of
the inputs (up to float rounding): Seide et al. (1-bit SGD, 2014), Karimireddy
et al. (EF-SGD, ICML'19). The parameter server's pushes carry it explicitly;
the gossip protocols get it by sending differences from what their receivers
hold (:mod:`hetrain.compression.gossip_codec`), where the residual is the model's
distance from its public copy.
"""

from __future__ import annotations

import torch

from hetrain.compression.codecs import Codec


class ErrorFeedback:
    def __init__(self, codec: Codec):
        self.codec = codec
        self.residual: torch.Tensor | None = None

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(payload, what the receiver will decode) for ``x`` plus the carried residual."""
        corrected = x.reshape(-1).to(torch.promote_types(x.dtype, torch.float32))  # float64 stays float64
        if self.residual is not None:
            corrected = corrected + self.residual
        payload = self.codec.encode(corrected.float())
        sent = self.codec.decode(payload).to(corrected.dtype)
        self.residual = corrected - sent  # what float32 rounding drops too
        return payload, sent
