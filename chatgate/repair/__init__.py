"""Repairs: the named fixes chatgate applies where the result is certainly valid (their vocabulary and
options), and the memory of the turns it relayed, from which a dropped `reasoning_content` is restored."""
