#!/usr/bin/python3
# Puts hand-made AMQP 1.0 messages on a broker, for the functional specs that need a message
# nimbus-host would never send itself (spec/functional/amqp_spec.lua). Debian's
# python3-qpid-proton: run it with /usr/bin/python3.
#
#   /usr/bin/python3 spec/helpers/amqp_send.py '{"url": "amqp://guest:guest@127.0.0.1:5672/VHOST",
#       "address": "/amq/queue/Ep",
#       "messages": [{"body": "not json", "properties": {"id": "m1", "group_id": "s1"},
#                     "application_properties": {"MessageType": "EventRequest", "EventTypeId": "Ok"}}]}'
#
# The argument is one JSON object:
#   url        amqp://user:pass@host:port/VHOST (vhost percent-encoded; no path = the default vhost "/")
#   address    target address, e.g. /amq/queue/NAME (an existing queue) or /exchange/NAME/ROUTING-KEY
#   messages   a list of messages; a message given at the top level (without "messages") is sent alone
# Each message:
#   body       a string (UTF-8)
#   body_type  "data" (default: the bytes in a data section), "string" (an amqp-value string)
#   properties the standard properties: id, correlation_id, subject, group_id, group_sequence, content_type,
#              content_encoding, reply_to, to, user_id, creation_time, absolute_expiry_time
#   application_properties  string keys; JSON strings, numbers and booleans keep their types
#   durable    true by default
# Every message is sent unsettled; the script waits for the broker's outcome and exits 0 once all
# were accepted (one line per message on stdout: "accepted ID"), 1 on any failure (reason on stderr),
# 2 on bad arguments.
#
# SASL PLAIN is forced whenever the URL has a user: RabbitMQ also offers ANONYMOUS, which proton would
# otherwise pick (scripts/rabbitmq-smoke.py). RabbitMQ 3.x selects the vhost from the open frame's
# hostname, written "vhost:NAME".
import json
import sys
import urllib.parse

from proton import ConnectionException, Message, Timeout
from proton.utils import BlockingConnection, LinkDetached, SendException

PROPERTIES = ("id", "correlation_id", "subject", "group_id", "group_sequence", "content_type",
              "content_encoding", "reply_to", "to", "user_id", "creation_time", "absolute_expiry_time")


def usage(msg):
    print("amqp_send: " + msg, file=sys.stderr)
    sys.exit(2)


def connect(url, timeout):
    u = urllib.parse.urlsplit(url)
    if u.scheme not in ("amqp", "amqps"):
        usage("url must be amqp:// or amqps://, not %r" % url)
    host = u.hostname or "127.0.0.1"
    port = u.port or (5671 if u.scheme == "amqps" else 5672)
    vhost = urllib.parse.unquote(u.path[1:]) if u.path.startswith("/") else ""
    kw = dict(timeout=timeout)
    if vhost:
        kw["virtual_host"] = "vhost:" + vhost
    if u.username is not None:
        kw.update(user=urllib.parse.unquote(u.username), password=urllib.parse.unquote(u.password or ""),
                  allowed_mechs="PLAIN", allow_insecure_mechs=True)
    return BlockingConnection("%s://%s:%d" % (u.scheme, host, port), **kw)


def make_message(spec):
    if not isinstance(spec, dict):
        usage("every message must be a JSON object, not %r" % (spec,))
    unknown = set(spec) - {"body", "body_type", "properties", "application_properties", "durable"}
    if unknown:
        usage("unknown message keys: %s" % ", ".join(sorted(unknown)))
    body = spec.get("body", "")
    if not isinstance(body, str):
        usage("body must be a string (encode JSON yourself)")
    body_type = spec.get("body_type", "data")
    m = Message(durable=spec.get("durable", True))
    if body_type == "data":
        m.body = body.encode("utf-8")
        m.inferred = True                  # bytes in a data section, not an amqp-value binary
    elif body_type == "string":
        m.body = body
    else:
        usage("body_type must be data or string, not %r" % body_type)
    for k, v in (spec.get("properties") or {}).items():
        if k not in PROPERTIES:
            usage("unknown property %r (known: %s)" % (k, ", ".join(PROPERTIES)))
        setattr(m, k, v)
    props = spec.get("application_properties")
    if props:
        m.properties = dict(props)
    return m


def main():
    if len(sys.argv) != 2:
        usage("usage: amqp_send.py JSON")
    try:
        args = json.loads(sys.argv[1])
    except ValueError as e:
        usage("the argument is not JSON: %s" % e)
    if not isinstance(args, dict) or "url" not in args or "address" not in args:
        usage("the argument needs url and address")
    specs = args.get("messages")
    if specs is None:
        specs = [{k: v for k, v in args.items() if k not in ("url", "address", "timeout")}]
    messages = [make_message(s) for s in specs]
    try:
        conn = connect(args["url"], args.get("timeout", 10))
        try:
            sender = conn.create_sender(args["address"])
            for m in messages:
                sender.send(m)             # raises SendException unless the outcome is accepted
                print("accepted %s" % (m.id,), flush=True)
        finally:
            conn.close()                   # ends the link too (links are never closed one by one, see
                                           # scripts/rabbitmq-smoke.py)
    except (SendException, LinkDetached, ConnectionException, Timeout) as e:
        print("amqp_send: %s: %s" % (type(e).__name__, e), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
