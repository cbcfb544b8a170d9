"""AMQP 0-9-1, a frontend of the core (docs/amqp.rst).

L{qmq.amqp.protocol} is the Twisted glue (the C{amqp:} listener),
L{qmq.amqp.session} the connection and its channels over the core's
L{qmq.core.channel.Channel}, L{qmq.amqp.codec} the frames and the message
model both ways (pamqp encodes and decodes the methods), and
L{qmq.amqp.settings} the C{[amqp]} table.
"""
