"""The parameter-server runtime: server shards, workers and engines (threads today; Ray next).

Strategies of the parameter-server family (sync, async, bsp, hop_bs, hop_bw, gba; later
ShadowSync and AdaPM) are rules plugged into this runtime, not copies of it.
"""
