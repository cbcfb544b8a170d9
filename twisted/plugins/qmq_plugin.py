"""Twisted plugin: C{twistd qmq} runs the QMQ broker.

The options and the service live in L{qmq.tap}, imported only when the
command is used.  This module must stay import-light: Twisted imports every
plugin module whenever it looks for plugins.
"""

from twisted.application.service import ServiceMaker

qmq = ServiceMaker(
    "QMQ",
    "qmq.tap",
    "QMQ, the Quick Message Queue: a fast STOMP message broker",
    "qmq",
)
