"""Offline comparison of pruners on recorded curves: the replay harness, the peer pruners, the frontiers."""
