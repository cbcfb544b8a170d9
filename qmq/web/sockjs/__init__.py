"""SockJS for browsers that cannot (or may not) use WebSocket: STOMP over
xhr-streaming, xhr-polling, eventsource, htmlfile, jsonp and WebSocket, in
the protocol sockjs-client speaks (as sockjs-node serves it).

  - L{qmq.web.sockjs.framing}: frames and payloads (sans-I/O);
  - L{qmq.web.sockjs.session}: sessions, their timers and bounds;
  - L{qmq.web.sockjs.resource}: the C{twisted.web} resource and its transports;
  - L{qmq.web.sockjs.stomp}: a SockJS session as a STOMP session's transport;
  - L{qmq.web.sockjs.services}: the protocol's test services.
"""
