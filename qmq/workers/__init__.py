"""Worker processes: one broker per core on one host (docs/workers.rst).

L{qmq.workers.supervisor} starts and restarts the workers,
L{qmq.workers.worker} makes a broker one of them (its data directory, its
node id, its links to the others), L{qmq.workers.sharing} lets them all
listen on the same ports, and L{qmq.workers.plan} decides, from the
settings, whether there is a supervisor at all.
"""
