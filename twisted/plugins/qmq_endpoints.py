"""Twisted plugin: QMQ's C{qmqtls:} server endpoint strings.

Makes C{serverFromString(reactor, "qmqtls:61614:privateKey=...:caCerts=...")}
(and so C{--listen stomp:qmqtls:...}) build a TLS listener that can require
client certificates.  The parser lives in L{qmq.tls}; this module only
exposes it to Twisted's plugin system, so keep it free of other code.
"""

from qmq.tls import QMQTLSServerParser

qmqtls = QMQTLSServerParser()
