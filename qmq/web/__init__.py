"""QMQ on the web: one C{twisted.web} site per C{http:} listener.

  - L{qmq.web.site}: the listener (caps, TLS deadlines, shutdown), the site,
    its mount points and the contract of a resource mounted there
    (L{qmq.web.site.WebContext}, L{qmq.web.site.MOUNTS}).
  - L{qmq.web.websocket}: STOMP over WebSocket at C{/stomp} and C{/ws}.
  - L{qmq.web.settings}: the C{[web]} table of the configuration.
  - C{static/qmq.js}: the browser client, at C{/qmq.js};
    C{examples/}: the example pages, at C{/examples/} when enabled.
"""
