"""Message stores: where a durable queue's persistent messages are kept.

The core owns the interface (L{qmq.core.store.MessageStore}) and calls it;
the service picks the implementation from the configuration (C{store}) and
gives it to the broker. The memory store keeps nothing; the commit-log store
(next) appends records to segment files.
"""
