"""Message stores: where a durable queue's persistent messages are kept.

The core owns the interface (L{qmq.core.store.MessageStore}) and calls it;
the service picks the implementation from the configuration (C{store}, see
L{qmq.service.STORES}) and gives it to the broker:

  - C{"memory"} (L{qmq.store.memory.MemoryStore}, the default) keeps
    nothing: a restart loses every message and every queue the
    configuration does not declare.
  - C{"log"} (L{qmq.store.log.CommitLogStore}) appends records to segment
    files in C{DATA_DIR/log} (L{qmq.store.record}, L{qmq.store.segment}),
    with group commit and an fsync policy; at start it replays them
    (L{qmq.store.replay}, L{qmq.store.index}).  Its settings are the
    C{[commit_log]} table (L{qmq.store.settings}); C{qmq-store}
    (L{qmq.store.tool}) reads a log directory offline.

docs/storage.rst describes what is kept, when it is on disk, and the format.
"""
