"""A sweep file run end to end: config and search space, preflight, the driver (runner), the trial function,
the lease, stages, stop signals, storage URLs and faults, and the end of a sweep (finish)."""
