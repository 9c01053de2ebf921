/* Unit tests for the AMQP transport's pure parts: the transport URL, the NimBus wire
 * mapping (nh_msg_t <-> AMQP message, through a real proton encode/decode), malformed
 * messages, and the name-based EventId. The broker paths run in the functional specs
 * against RabbitMQ (the functional specs under ctest -L amqp). */
#include "nh_test.h"

#include "transport/nh_amqp.h"
#include "transport/nh_amqp_int.h"

#include <proton/codec.h>

TEST(url_full)
{
  nh_amqp_url_t u;
  nh_error_t err = {0};
  ASSERT_EQ_INT(nh_amqp_url_parse("amqps://us%40er:p%3Ass@broker.example:5999/my%2Fvhost?management=http://m:1/&ca=/x/ca.pem"
                                  "&verify=0&idle=2.5&exchange=ev",
                                  &u, &err),
                NH_OK);
  ASSERT_EQ_INT(u.tls, 1);
  ASSERT_EQ_STR(u.user, "us@er");
  ASSERT_EQ_STR(u.password, "p:ss");
  ASSERT_EQ_STR(u.host, "broker.example");
  ASSERT_EQ_INT(u.port, 5999);
  ASSERT_EQ_STR(u.vhost, "my/vhost");
  ASSERT_EQ_STR(u.management, "http://m:1");
  ASSERT_EQ_STR(u.ca, "/x/ca.pem");
  ASSERT_EQ_INT(u.verify, 0);
  ASSERT_EQ_INT(u.idle_ms, 2500);
  ASSERT_EQ_STR(u.exchange, "ev");
  ASSERT_TRUE(strstr(u.display, "p:ss") == NULL);   /* never the password in logs */
  nh_amqp_url_clear(&u);
}

TEST(url_defaults)
{
  nh_amqp_url_t u;
  nh_error_t err = {0};
  ASSERT_EQ_INT(nh_amqp_url_parse("amqp://guest:guest@127.0.0.1", &u, &err), NH_OK);
  ASSERT_EQ_INT(u.tls, 0);
  ASSERT_EQ_INT(u.port, 5672);
  ASSERT_NULL(u.vhost);
  ASSERT_EQ_STR(u.exchange, "nimbus.events");
  ASSERT_EQ_STR(u.management, "http://127.0.0.1:15672");
  ASSERT_EQ_INT(u.verify, 1);
  nh_amqp_url_clear(&u);
  ASSERT_EQ_INT(nh_amqp_url_parse("amqps://h", &u, &err), NH_OK);
  ASSERT_EQ_INT(u.port, 5671);
  nh_amqp_url_clear(&u);
}

TEST(url_errors_say_what_is_wrong)
{
  nh_amqp_url_t u;
  nh_error_t err = {0};
  ASSERT_EQ_INT(nh_amqp_url_parse("http://h:5672", &u, &err), NH_EUSAGE);
  ASSERT_CONTAINS(err.msg, "amqp:// or amqps://");
  ASSERT_EQ_INT(nh_amqp_url_parse("amqp://h?colour=blue", &u, &err), NH_EUSAGE);
  ASSERT_CONTAINS(err.msg, "unknown parameter colour");
  ASSERT_EQ_INT(nh_amqp_url_parse("amqp://h?profile=sqs", &u, &err), NH_EUSAGE);
  ASSERT_CONTAINS(err.msg, "servicebus");
  ASSERT_EQ_INT(nh_amqp_url_parse("amqp://h:99999", &u, &err), NH_EUSAGE);
  ASSERT_TRUE(nh_amqp_is_url("amqp://x") && nh_amqp_is_url("amqps://x") && !nh_amqp_is_url("embedded"));
}

TEST(url_servicebus_profile)
{
  nh_amqp_url_t u;
  nh_error_t err = {0};
  ASSERT_EQ_INT(nh_amqp_url_parse("amqps://Root:k@ns.servicebus.windows.net", &u, &err), NH_OK);
  ASSERT_EQ_INT(u.servicebus, 1);   /* from the host name */
  nh_amqp_url_clear(&u);
  ASSERT_EQ_INT(nh_amqp_url_parse("amqp://Root:k@127.0.0.1:5672/?profile=servicebus", &u, &err), NH_OK);
  ASSERT_EQ_INT(u.servicebus, 1);   /* the emulator, or a fake */
  nh_amqp_url_clear(&u);
  ASSERT_EQ_INT(nh_amqp_url_parse("amqps://Root:k@ns.servicebus.windows.net?profile=generic", &u, &err), NH_OK);
  ASSERT_EQ_INT(u.servicebus, 0);
  nh_amqp_url_clear(&u);
}

/* Expected value computed independently (Python's hmac, base64 and urllib.parse.quote). */
TEST(sas_token_matches_the_documented_format)
{
  char tok[1024];
  ASSERT_EQ_INT(nh_sb_sas_token("sb://ns.servicebus.windows.net/nimbus.events", "RootManageSharedAccessKey",
                                "secret-key", 1700000000, tok, sizeof tok),
                NH_OK);
  ASSERT_EQ_STR(tok, "SharedAccessSignature sr=sb%3A%2F%2Fns.servicebus.windows.net%2Fnimbus.events&sig=PLNZlBDYWpt%2FeX%2BRpMoa%2Ba9EQp8i44V8sJFndELDC3g%3D&se=1700000000&skn=RootManageSharedAccessKey");
}

/* encode -> bytes -> decode, as it crosses the wire */
static void round_trip_as(const nh_msg_t *in, const char *to, const char *endpoint, nh_msg_t *out, int sb)
{
  pn_message_t *pm = pn_message();
  nh_amqp_msg_encode(pm, in, to, sb);
  char buf[8192];
  size_t n = sizeof buf;
  ASSERT_EQ_INT(pn_message_encode(pm, buf, &n), 0);
  pn_message_free(pm);
  pm = pn_message();
  ASSERT_EQ_INT(pn_message_decode(pm, buf, n), 0);
  nh_amqp_msg_decode(pm, endpoint, out);
  pn_message_free(pm);
}

static void round_trip(const nh_msg_t *in, const char *to, const char *endpoint, nh_msg_t *out)
{
  round_trip_as(in, to, endpoint, out, 0);
}

TEST(mapping_round_trip)
{
  nh_msg_t m;
  memset(&m, 0, sizeof m);
  m.message_id = "m-1";
  m.session_id = "acct-42";
  m.event_type = "CrmAccountCreated";
  m.type = NH_MT_EVENT;
  m.correlation_id = "c-1";
  m.originating_message_id = "o-1";
  m.from = "CrmEndpoint";
  m.retry_count = 2;
  m.enqueued_at = 1700000000123;
  m.body = "{\"AccountId\":\"42\"}";
  m.body_len = strlen(m.body);
  nh_msg_t got;
  round_trip(&m, NULL, "ErpEndpoint", &got);
  ASSERT_EQ_INT(got.type, NH_MT_EVENT);
  ASSERT_NULL(got.error_text);
  ASSERT_EQ_STR(got.endpoint, "ErpEndpoint");
  ASSERT_EQ_STR(got.message_id, "m-1");
  ASSERT_EQ_STR(got.session_id, "acct-42");
  ASSERT_EQ_STR(got.event_type, "CrmAccountCreated");
  ASSERT_EQ_STR(got.correlation_id, "c-1");
  ASSERT_EQ_STR(got.originating_message_id, "o-1");
  ASSERT_NULL(got.parent_message_id);   /* "self" on the wire */
  ASSERT_EQ_STR(got.from, "CrmEndpoint");
  ASSERT_EQ_INT(got.retry_count, 2);
  ASSERT_TRUE(got.enqueued_at == 1700000000123);
  ASSERT_EQ_STR(got.body, "{\"AccountId\":\"42\"}");
  ASSERT_EQ_INT((int)got.body_len, (int)strlen(m.body));
  /* no EventId on the wire: the endpoint derives one, the same for a redelivered copy */
  char eid[37];
  nh_amqp_event_id("ErpEndpoint", "m-1", 1700000000123, eid);
  ASSERT_EQ_STR(got.event_id, eid);
  nh_msg_clear(&got);
}

TEST(mapping_keeps_a_publisher_event_id_and_reply_fields)
{
  nh_msg_t m;
  memset(&m, 0, sizeof m);
  m.message_id = "m-2";
  m.session_id = "s";
  m.event_type = "CreditChecked";
  m.event_id = "e-given";
  m.type = NH_MT_REPLY;
  m.reply_to = "_reply.x";
  m.error_text = "boom";
  m.error_type = "Err";
  nh_msg_t got;
  round_trip(&m, "_reply.x", "_reply.x", &got);
  ASSERT_EQ_INT(got.type, NH_MT_REPLY);
  ASSERT_EQ_STR(got.event_id, "e-given");
  ASSERT_EQ_STR(got.reply_to, "_reply.x");
  ASSERT_EQ_STR(got.error_text, "boom");
  ASSERT_EQ_STR(got.error_type, "Err");
  ASSERT_EQ_INT((int)got.body_len, 0);
  nh_msg_clear(&got);
}

#define TP "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

/* An EventRequest of type T in session s carrying a trace context (strings borrowed). */
static nh_msg_t traced_event(const char *message_id, const char *tracestate)
{
  nh_msg_t m;
  memset(&m, 0, sizeof m);
  m.message_id = (char *)message_id;
  m.session_id = "s";
  m.event_type = "T";
  m.type = NH_MT_EVENT;
  m.traceparent = TP;
  m.tracestate = (char *)tracestate;
  return m;
}

TEST(trace_context_travels_as_application_properties)
{
  nh_msg_t m = traced_event("m-t", "vendor=abc");
  nh_msg_t got;
  round_trip(&m, NULL, "Ep", &got);
  ASSERT_EQ_STR(got.traceparent, TP);
  ASSERT_EQ_STR(got.tracestate, "vendor=abc");
  nh_msg_clear(&got);
  /* none sent, none received */
  m.traceparent = m.tracestate = NULL;
  round_trip(&m, NULL, "Ep", &got);
  ASSERT_NULL(got.traceparent);
  ASSERT_NULL(got.tracestate);
  nh_msg_clear(&got);
}

/* The Service Bus profile also writes Diagnostic-Id; a sender that wrote only that
 * (an Azure SDK) is read through it, and an old SDK's non-W3C id is left out. */
TEST(diagnostic_id_on_the_service_bus_profile)
{
  pn_message_t *pm = pn_message();
  nh_msg_t m = traced_event("m-d", NULL);
  nh_amqp_msg_encode(pm, &m, NULL, 1);
  pn_data_t *p = pn_message_properties(pm);
  pn_data_rewind(p);
  pn_data_next(p);
  pn_data_enter(p);
  int found = 0;
  while (pn_data_next(p)) {
    pn_bytes_t k = pn_data_get_string(p);
    pn_data_next(p);
    if (k.size == 13 && memcmp(k.start, "Diagnostic-Id", 13) == 0) {
      pn_bytes_t v = pn_data_get_string(p);
      ASSERT_TRUE(v.size == strlen(TP) && memcmp(v.start, TP, v.size) == 0);
      found = 1;
    }
  }
  ASSERT_TRUE(found);
  pn_message_free(pm);

  const char *diag[] = { TP, "|4bf92f3577b34da6a3ce929d0e0e4736.00f067aa0ba902b7." };
  for (int i = 0; i < 2; i++) {
    pm = pn_message();
    pn_atom_t id = { .type = PN_STRING };
    id.u.as_bytes = pn_bytes(3, "m-4");
    pn_message_set_id(pm, id);
    pn_message_set_group_id(pm, "g");
    pn_message_set_subject(pm, "T");
    p = pn_message_properties(pm);
    pn_data_put_map(p);
    pn_data_enter(p);
    pn_data_put_string(p, pn_bytes(11, "MessageType"));
    pn_data_put_string(p, pn_bytes(12, "EventRequest"));
    pn_data_put_string(p, pn_bytes(13, "Diagnostic-Id"));
    pn_data_put_string(p, pn_bytes(strlen(diag[i]), diag[i]));
    pn_data_exit(p);
    pn_data_put_binary(pn_message_body(pm), pn_bytes(2, "{}"));
    nh_msg_t got;
    nh_amqp_msg_decode(pm, "Ep", &got);
    ASSERT_EQ_INT(got.type, NH_MT_EVENT);
    if (i == 0) ASSERT_EQ_STR(got.traceparent, TP);
    else ASSERT_NULL(got.traceparent);
    nh_msg_clear(&got);
    pn_message_free(pm);
  }
}

/* The application properties become MessageType = EventRequest and nothing else. */
static void only_message_type(pn_message_t *pm)
{
  pn_data_t *p = pn_message_properties(pm);
  pn_data_clear(p);
  pn_data_put_map(p);
  pn_data_enter(p);
  pn_data_put_string(p, pn_bytes(11, "MessageType"));
  pn_data_put_string(p, pn_bytes(12, "EventRequest"));
  pn_data_exit(p);
}

/* The routing key carries the session's bucket (docs/broker-partitions.md): the hash is
 * FNV-1a, fixed here because every host version must put a session in the same partition. */
TEST(routing_keys_carry_the_session_bucket_and_decode_back_to_the_type)
{
  ASSERT_EQ_INT((int)nh_amqp_session_bucket("s1"), 201);
  ASSERT_EQ_INT((int)nh_amqp_session_bucket("order-42"), 244);
  char key[128], words[32];
  nh_amqp_routing_key("OrderPlaced", "s1", key, sizeof key);
  ASSERT_EQ_STR(key, "OrderPlaced.1.1.0.0.1.0.0.1");
  nh_amqp_bucket_words(5, 3, words);   /* partition 5 of 8 binds Type.#.1.0.1 */
  ASSERT_EQ_STR(words, ".1.0.1");
  nh_amqp_bucket_words(0, 0, words);   /* one queue binds Type.# */
  ASSERT_EQ_STR(words, "");

  nh_msg_t m;
  memset(&m, 0, sizeof m);
  m.type = NH_MT_EVENT;
  m.message_id = "m-9";
  m.event_type = "OrderPlaced";
  m.session_id = "s1";
  m.body = "{}";
  m.body_len = 2;
  pn_message_t *pm = pn_message();
  nh_amqp_msg_encode(pm, &m, NULL, NH_AMQP_ENC_BUCKETS);   /* through the exchange: the routing key */
  ASSERT_EQ_STR(pn_message_get_subject(pm), "OrderPlaced.1.1.0.0.1.0.0.1");
  nh_msg_t got;
  nh_amqp_msg_decode(pm, "Ep", &got);
  ASSERT_EQ_STR(got.event_type, "OrderPlaced");
  nh_msg_clear(&got);
  /* a sender that sets no EventTypeId: the type is the subject without the bucket words */
  only_message_type(pm);
  nh_amqp_msg_decode(pm, "Ep", &got);
  ASSERT_EQ_STR(got.event_type, "OrderPlaced");
  nh_msg_clear(&got);
  pn_message_set_subject(pm, "Order.1.0");   /* too few words: a type with dots of its own */
  nh_amqp_msg_decode(pm, "Ep", &got);
  ASSERT_EQ_STR(got.event_type, "Order.1.0");
  nh_msg_clear(&got);
  nh_amqp_msg_encode(pm, &m, "Ep", NH_AMQP_ENC_BUCKETS);   /* straight to a queue: the type */
  ASSERT_EQ_STR(pn_message_get_subject(pm), "OrderPlaced");
  nh_amqp_msg_encode(pm, &m, NULL, 0);   /* management=none: bindings made by hand on the type */
  ASSERT_EQ_STR(pn_message_get_subject(pm), "OrderPlaced");
  nh_amqp_msg_encode(pm, &m, NULL, NH_AMQP_ENC_SERVICEBUS);   /* Service Bus filters subscriptions on it */
  ASSERT_EQ_STR(pn_message_get_subject(pm), "OrderPlaced");
  pn_message_free(pm);
}

TEST(malformed_messages_name_the_problem)
{
  pn_message_t *pm = pn_message();
  nh_msg_t got;
  /* nothing but a body */
  pn_data_put_string(pn_message_body(pm), pn_bytes(2, "{}"));
  nh_amqp_msg_decode(pm, "Ep", &got);
  ASSERT_EQ_INT(got.type, NH_MT_UNKNOWN);
  ASSERT_CONTAINS(got.error_text, "no message-id");
  ASSERT_NOT_NULL(got.message_id);   /* minted, so the audit row has one */
  ASSERT_NOT_NULL(got.session_id);
  ASSERT_NOT_NULL(got.event_id);
  nh_msg_clear(&got);
  /* an id and a group, but no MessageType */
  pn_atom_t id = { .type = PN_STRING };
  id.u.as_bytes = pn_bytes(3, "m-3");
  pn_message_set_id(pm, id);
  pn_message_set_group_id(pm, "g");
  pn_message_set_subject(pm, "T");
  nh_amqp_msg_decode(pm, "Ep", &got);
  ASSERT_EQ_INT(got.type, NH_MT_UNKNOWN);
  ASSERT_CONTAINS(got.error_text, "no MessageType");
  ASSERT_EQ_STR(got.message_id, "m-3");
  nh_msg_clear(&got);
  /* a map body is not JSON text */
  only_message_type(pm);
  pn_data_t *b = pn_message_body(pm);
  pn_data_clear(b);
  pn_data_put_map(b);
  nh_amqp_msg_decode(pm, "Ep", &got);
  ASSERT_EQ_INT(got.type, NH_MT_UNKNOWN);
  ASSERT_CONTAINS(got.error_text, "not a data section");
  nh_msg_clear(&got);
  pn_message_free(pm);
}

TEST(event_id_is_name_based_per_endpoint)
{
  char a[37], b[37], c[37];
  nh_amqp_event_id("ErpEndpoint", "m-1", 0, a);
  nh_amqp_event_id("ErpEndpoint", "m-1", 0, b);
  nh_amqp_event_id("CrmEndpoint", "m-1", 0, c);
  ASSERT_EQ_STR(a, b);
  ASSERT_NE_STR(a, c);   /* each consuming endpoint's copy is its own audit event */
  ASSERT_EQ_INT((int)strlen(a), 36);
  ASSERT_TRUE(a[14] == '5');   /* version 5 without a creation time */
  ASSERT_TRUE(a[19] == '8' || a[19] == '9' || a[19] == 'a' || a[19] == 'b');
  /* pinned: ids in existing stores must not change with the implementation (the value is
   * Python's uuid.uuid5 of the same namespace and name) */
  ASSERT_EQ_STR(a, "9a81b158-19ad-516f-8a63-21bf68a6b8fa");
  nh_amqp_event_id("Ep", "m-zzz", 1700000000000, c);
  ASSERT_EQ_STR(c, "018bcfe5-6800-8dc6-a68c-e0d60fab7799");
}

TEST(event_id_with_a_creation_time_is_time_ordered)
{
  char a[37], b[37], c[37], d[37];
  nh_amqp_event_id("Ep", "m-zzz", 1700000000000, a);
  nh_amqp_event_id("Ep", "m-aaa", 1700000000001, b);   /* later, whatever the hash */
  nh_amqp_event_id("Ep", "m-zzz", 1700000000000, c);
  nh_amqp_event_id("Other", "m-zzz", 1700000000000, d);
  ASSERT_CMP_INT(strcmp(a, b), <, 0);
  ASSERT_EQ_STR(a, c);
  ASSERT_NE_STR(a, d);
  ASSERT_TRUE(a[14] == '8');
  ASSERT_TRUE(strncmp(a, "018bcfe5-6800", 13) == 0);   /* 1700000000000 ms = 0x018bcfe56800 */
}

TEST(spreading_hands_on_what_is_beyond_the_share_only_when_the_view_is_whole)
{
  int out[8];
  /* 8 partitions all here, two others waiting on each: 8 / 3 rounded up is 3, so 5 go,
   * the least loaded first */
  int owner[8] = { 0, 0, 0, 0, 0, 0, 0, 0 }, waiting[8] = { 2, 2, 2, 2, 2, 2, 2, 2 };
  int load[8] = { 9, 0, 4, 0, 1, 7, 0, 2 };
  int n = nh_amqp_spread_pick(8, 3, owner, waiting, load, out);
  ASSERT_EQ_INT(n, 5);
  int got[8] = { 0 };
  for (int i = 0; i < n; i++) got[out[i]] = 1;
  ASSERT_TRUE(got[1] && got[3] && got[6] && got[4] && got[7]);
  ASSERT_TRUE(!got[0] && !got[5] && !got[2]);
  /* alone: nothing to hand on */
  ASSERT_EQ_INT(nh_amqp_spread_pick(8, 1, owner, waiting, load, out), 0);
  /* 3, 3, 2 is even */
  int even[8] = { 0, 0, 0, 1, 1, 1, 2, 2 };
  ASSERT_EQ_INT(nh_amqp_spread_pick(8, 3, even, waiting, load, out), 0);
  /* 3, 4, 1: the host with 4 hands on one; this host (3, above the share rounded down while
   * another has less) hands on one too */
  int uneven[8] = { 0, 0, 0, 1, 1, 1, 1, 2 };
  ASSERT_EQ_INT(nh_amqp_spread_pick(8, 3, uneven, waiting, load, out), 1);
  ASSERT_EQ_INT(out[0], 1);   /* the least loaded of 0..2 */
  /* a partition shown without an active consumer (a move the API shows late): wait */
  int moving[8] = { 0, 0, 0, 0, 0, 0, 0, -1 };
  ASSERT_EQ_INT(nh_amqp_spread_pick(8, 3, moving, waiting, load, out), 0);
  int twice[8] = { 0, 0, 0, 0, 0, 0, 0, -2 };   /* two active rows: the old one not gone yet */
  ASSERT_EQ_INT(nh_amqp_spread_pick(8, 3, twice, waiting, load, out), 0);
  /* nobody else waits on a partition: it stays */
  int alone[8] = { 0, 0, 0, 0, 0, 0, 0, 0 }, none[8] = { 0 };
  ASSERT_EQ_INT(nh_amqp_spread_pick(8, 2, alone, none, load, out), 0);
}

NH_TEST_MAIN()
