"""QMQ, the Quick Message Queue: one AMQP-shaped broker core, many wire protocols."""

__version__ = "0.1.0"
