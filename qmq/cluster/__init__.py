"""Nodes of a QMQ mesh: for now, what names this node (L{qmq.cluster.settings})."""
