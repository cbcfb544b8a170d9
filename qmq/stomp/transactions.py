# -*- test-case-name: tests.test_stomp_session -*-
"""STOMP transactions: BEGIN, the frames held in them, COMMIT and ABORT.

L{TransactionsMixin} is the part of L{qmq.stomp.session.StompSession} that
runs only for clients that use transactions:

    BEGIN -> an empty list in C{transactions} (capped by
      C{stomp.max_transactions})
    SEND/ACK/NACK with a C{transaction} header -> C{_hold}: the frame is
      kept (capped by C{stomp.max_transaction_frames} and
      C{stomp.max_transaction_bytes} over the whole connection)
    COMMIT -> every held frame replayed in order through the session's own
      publish and settle paths; its RECEIPT waits for the last durable
      publish (the store keeps order, so the last one covers all)
    ABORT -> the frames are dropped

It is a mixin because the session dispatches C{BEGIN}/C{COMMIT}/C{ABORT}
to its own methods by name and C{stomp_SEND}/C{stomp_ACK}/C{stomp_NACK}
call C{_hold} on their way; a transaction replays through the session's
hot paths (C{_publish}, C{_ack_target}), which stay in
L{qmq.stomp.session}. The mixin has no state of its own: C{transactions},
C{_transaction_frames} and C{_transaction_bytes} are set in
C{StompSession.__init__}.
"""

from __future__ import annotations

from typing import Any

from qmq.stomp.errors import StompError
from qmq.stomp.frame import Frame


class TransactionsMixin:
    """BEGIN, COMMIT, ABORT (see the module docstring)."""

    # Set by StompSession; declared for type checkers.
    settings: Any
    channel: Any
    transactions: dict[str, list[tuple[str, Frame]]]


    def _transaction(self, name: str) -> list[tuple[str, Frame]]:
        ops = self.transactions.get(name)
        if ops is None:
            raise StompError("unknown transaction", f"Transaction {name!r} was not begun.")
        return ops

    def _hold(self, name: str, kind: str, frame: Frame) -> None:
        """Keep a frame of an open transaction, within the connection's caps."""
        ops = self._transaction(name)
        settings = self.settings
        if settings.max_transaction_frames and self._transaction_frames >= settings.max_transaction_frames:
            raise StompError(
                "transaction too large",
                f"A connection may hold at most {settings.max_transaction_frames} frames in "
                "open transactions (stomp.max_transaction_frames).",
            )
        size = len(frame.body)
        if settings.max_transaction_bytes and self._transaction_bytes + size > settings.max_transaction_bytes:
            raise StompError(
                "transaction too large",
                f"A connection may hold at most {settings.max_transaction_bytes} bytes of bodies "
                "in open transactions (stomp.max_transaction_bytes).",
            )
        self._transaction_frames += 1
        self._transaction_bytes += size
        ops.append((kind, frame))

    def _end_transaction(self, name: str) -> list[tuple[str, Frame]]:
        ops = self._transaction(name)
        del self.transactions[name]
        self._transaction_frames -= len(ops)
        self._transaction_bytes -= sum(len(op.body) for _, op in ops)
        return ops

    def stomp_BEGIN(self, frame: Frame) -> None:
        name = self._require(frame, "transaction")
        if name in self.transactions:
            raise StompError("transaction already begun", f"Transaction {name!r} is already open.")
        cap = self.settings.max_transactions
        if cap and len(self.transactions) >= cap:
            raise StompError(
                "too many transactions",
                f"A connection may hold at most {cap} open transactions (stomp.max_transactions).",
            )
        self.transactions[name] = []
        self._receipt(frame)

    def stomp_COMMIT(self, frame: Frame) -> None:
        name = self._require(frame, "transaction")
        ops = self._end_transaction(name)
        channel = self.channel
        assert channel is not None
        waiter = None
        for kind, op in ops:
            if kind == "SEND":
                result = self._publish(op)
                if result is not None and result.__class__ is not list:
                    waiter = result  # the store keeps order: the last one covers all
            else:
                try:
                    sub, tag = self._ack_target(op)
                except StompError:
                    continue  # already settled (e.g. its subscription ended)
                if kind == "ACK":
                    channel.settle_delivery(sub, tag, True)
                else:
                    channel.settle_delivery(sub, tag, False, self._requeue(op))
        receipt = frame.headers.get("receipt")
        if receipt is not None:
            self._send_receipt(receipt, None, waiter)

    def stomp_ABORT(self, frame: Frame) -> None:
        name = self._require(frame, "transaction")
        self._end_transaction(name)
        self._receipt(frame)
