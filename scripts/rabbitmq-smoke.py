#!/usr/bin/python3
# Smoke test of the local RabbitMQ (scripts/rabbitmq.sh start) for the AMQP 1.0 transport.
#
#   /usr/bin/python3 scripts/rabbitmq-smoke.py        exit 0 = everything below worked
#
# 1. Management HTTP API (guest/guest, localhost only): declare the topic exchange nimbus.events, the durable
#    queue TestEndpoint and the binding nimbus.events --Ping--> TestEndpoint; purge the queue.
# 2. AMQP 1.0 (python3-qpid-proton, Debian's, so run it with /usr/bin/python3, not the pyenv python3):
#    - SASL PLAIN is forced: RabbitMQ also offers ANONYMOUS and proton would pick it even with a password
#      set, which makes a wrong password "succeed". A wrong password must be refused.
#    - send to the exchange address /exchange/nimbus.events/Ping (routing key in the address),
#      receive from /amq/queue/TestEndpoint (existing queue only, never declares) and accept,
#      then the same through /queue/TestEndpoint (that form declares; its durability follows the link
#      terminus, so attaching to our durable queue needs a durable source, else PRECONDITION_FAILED).
#    - after accept the queue is empty.
#    - Links are never closed one by one: RabbitMQ 3.10 answers our detach(closed=true) with a detach WITHOUT
#      closed=true, so proton never sees the remote close and BlockingLink.close() times out. Each round trip
#      uses its own connection and ends it with a connection close, which the broker answers properly.
# Env: NH_RMQ_PORT (5672), NH_RMQ_MGMT_PORT (15672).
import base64
import json
import os
import sys
import urllib.request
import uuid

from proton import ConnectionException, Message, Timeout
from proton.reactor import DurableSubscription
from proton.utils import BlockingConnection, LinkDetached, SendException

AMQP_URL = "amqp://127.0.0.1:%s" % os.environ.get("NH_RMQ_PORT", "5672")
API = "http://127.0.0.1:%s/api" % os.environ.get("NH_RMQ_MGMT_PORT", "15672")
EXCHANGE, QUEUE, KEY = "nimbus.events", "TestEndpoint", "Ping"
SASL = dict(user="guest", password="guest", allowed_mechs="PLAIN", allow_insecure_mechs=True)


def api(method, path, body=None):
    """One management API call; raises on any non-2xx answer."""
    req = urllib.request.Request(API + path, method=method,
                                 data=None if body is None else json.dumps(body).encode())
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=10) as r:
        data = r.read()
        return json.loads(data) if data else None


def step(name):
    print("smoke: " + name, flush=True)


def fail(msg):
    print("smoke: FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def declare_topology():
    step("declare exchange %s, queue %s, binding %s (management API %s)" % (EXCHANGE, QUEUE, KEY, API))
    api("PUT", "/exchanges/%2F/" + EXCHANGE, {"type": "topic", "durable": True})
    api("PUT", "/queues/%2F/" + QUEUE, {"durable": True})
    api("POST", "/bindings/%2F/e/{}/q/{}".format(EXCHANGE, QUEUE), {"routing_key": KEY})
    api("DELETE", "/queues/%2F/{}/contents".format(QUEUE))            # purge leftovers of earlier runs
    binds = api("GET", "/bindings/%2F/e/{}/q/{}".format(EXCHANGE, QUEUE))
    if not any(b["routing_key"] == KEY for b in binds):
        fail("binding not listed: %r" % binds)


def wrong_password_is_refused():
    step("SASL PLAIN with a wrong password is refused")
    try:
        c = BlockingConnection(AMQP_URL, timeout=10, **dict(SASL, password="wrong"))
        c.close()
    except ConnectionException as e:
        if "unauthorized" not in str(e) and "Authentication failed" not in str(e):
            print("smoke: (refused with: %s)" % e)
        return
    fail("a wrong password was accepted (ANONYMOUS used instead of PLAIN?)")


def round_trip(conn, source, durable_source):
    body = "ping " + uuid.uuid4().hex
    msg = Message(id=str(uuid.uuid4()), subject=KEY, body=body, durable=True,
                  content_type="text/plain", properties={"k": "v", "n": 1})
    target = "/exchange/{}/{}".format(EXCHANGE, KEY)
    step("send to %s (unsettled, waits for the broker's outcome)" % target)
    sender = conn.create_sender(target)
    sender.send(msg)                       # raises SendException unless the outcome is accepted

    step("receive from %s" % source)
    opts = DurableSubscription() if durable_source else None
    receiver = conn.create_receiver(source, credit=1, options=opts)
    got = receiver.receive(timeout=10)     # raises Timeout
    if (got.body, got.id, got.subject, got.properties) != (body, msg.id, KEY, msg.properties):
        fail("received something else: body=%r id=%r subject=%r props=%r"
             % (got.body, got.id, got.subject, got.properties))
    receiver.accept()
    try:                                   # the accepted message is gone
        extra = receiver.receive(timeout=1)
        fail("queue not empty after accept: %r" % extra.body)
    except Timeout:
        pass


def main():
    declare_topology()
    wrong_password_is_refused()
    for source, durable in (("/amq/queue/" + QUEUE, False), ("/queue/" + QUEUE, True)):
        step("connect %s, SASL PLAIN guest" % AMQP_URL)
        try:
            conn = BlockingConnection(AMQP_URL, timeout=10, **SASL)
            try:
                round_trip(conn, source, durable_source=durable)
            finally:
                conn.close()               # also ends the links (see the header)
        except (SendException, LinkDetached, ConnectionException, Timeout) as e:
            fail("%s: %s" % (type(e).__name__, e))
    step("OK")


if __name__ == "__main__":
    main()
