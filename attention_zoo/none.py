"""No attention: every token keeps its own value and nothing mixes across the sequence.

The "none" row of the YOSO and Nystromformer LRA tables: it measures how much a task can be solved
without any token mixing (the encoder's MLPs and mean pooling still see every token).
"""

from __future__ import annotations

from .registry import Attention, register


@register("none")
class NoAttention(Attention):
    def attend(self, q, k, v, mask):
        return v
