"""Message stores: where a durable queue's messages are kept.

The core calls a store through the small interface of
L{qmq.store.base.MessageStore}; the memory store keeps nothing beyond the
queues themselves, the commit-log store (a later stage) appends records to
segment files.
"""
