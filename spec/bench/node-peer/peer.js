'use strict';
// The Node.js peer of spec/bench/amqp.lua: what a plain Node.js service does for nimbus-host's
// happy path over AMQP 1.0, to compare the host's cost per event with.
//
//   node peer.js URL QUEUE DB [ENDPOINT]
//
// URL is amqp://user:pass@host:port/vhost (the vhost is sent as the open hostname
// "vhost:NAME", as RabbitMQ expects). Receives from /amq/queue/QUEUE (rcv-settle-mode first)
// and records every event in the sqlite file DB under ENDPOINT (default NodeEp), with the
// host's own tables (audit, history, processed: the columns and indexes of the host's schema,
// host/src/store/nh_store_schema.h, and its pragmas: WAL, synchronous=NORMAL,
// temp_store=MEMORY, auto_vacuum=INCREMENTAL). Per event, as the host does for a trivial
// handler on a broker:
//   - the audit upsert (the host's statement: a row keyed by event id and endpoint, status
//     Completed, payload, message id, correlation id, session, type, timestamps, queue and
//     processing times, a fresh W3C traceparent),
//   - a history row (EventRequest, Completed, "handler completed"),
//   - a processed row (the broker cannot join the transaction: a redelivery finds it).
// The event id is the host's (nh_amqp_event_id: SHA-1 of endpoint "\n" message-id under the
// host's namespace, the creation time in the first 48 bits), so keys grow with time as they
// do in the host.
// Batches: one transaction per event-loop turn, at most PEER_BATCH (256) deliveries; each
// delivery is accepted only after its batch committed. Credit as the host's
// (nh_amqp_topup): a window of PEER_WINDOW (1024 = 4 x the host endpoint's concurrency 256)
// buffered, uncommitted or granted, topped up to the window once that falls to half.
// What the host does beyond this (and the peer does not): a Lua handler call, session locks
// and per-session ordering, a savepoint per event, retries, parking, metrics, the console.
//
// Logs "ready: ..." on stderr once the link is attached (the bench times from there), runs
// until SIGTERM/SIGINT, then commits what it holds, closes and prints one JSON line on stdout:
// {"received":..,"committed":..,"batches":..,"max_batch":..,"ready_ms":..,"last_commit_ms":..,
//  "cpu_s":..,"max_rss_kb":..,"sqlite":..} (times from process start).
const crypto = require('node:crypto');
const rhea = require('rhea');
const Database = require('better-sqlite3');

const [url, queue, dbPath, endpointArg] = process.argv.slice(2);
if (!url || !queue || !dbPath) {
  process.stderr.write('usage: node peer.js URL QUEUE DB [ENDPOINT]\n');
  process.exit(2);
}
const ENDPOINT = endpointArg || 'NodeEp';
const WINDOW = Number(process.env.PEER_WINDOW || 1024);
const BATCH = Number(process.env.PEER_BATCH || 256);
const t0 = process.hrtime.bigint();
const sinceStart = () => Number(process.hrtime.bigint() - t0) / 1e6;

function die(msg) {
  process.stderr.write('peer: ' + msg + '\n');
  process.exit(1);
}

// ------------------------------------------------------------------ the store
const db = new Database(dbPath);
db.pragma('auto_vacuum = INCREMENTAL');   // before the first table, as the host
db.pragma('journal_mode = WAL');
db.pragma('synchronous = NORMAL');
db.pragma('temp_store = MEMORY');
db.pragma('busy_timeout = 10000');
db.exec(`
CREATE TABLE IF NOT EXISTS audit (
  endpoint TEXT NOT NULL, event_id TEXT NOT NULL, session_id TEXT NOT NULL,
  event_type TEXT, status TEXT NOT NULL, sub_status TEXT,
  error_text TEXT, error_type TEXT, handoff_reason TEXT, external_job_id TEXT,
  expected_by INTEGER, message_id TEXT, correlation_id TEXT, originating_message_id TEXT,
  retry_count INTEGER NOT NULL DEFAULT 0, payload TEXT, result TEXT, error_stack TEXT,
  created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL,
  fail_group TEXT, attempts INTEGER NOT NULL DEFAULT 0,
  queue_time_ms INTEGER, processing_time_ms INTEGER, overdue_at INTEGER, traceparent TEXT,
  PRIMARY KEY (event_id, endpoint));
CREATE INDEX IF NOT EXISTS audit_status ON audit(status, endpoint, updated_at);
CREATE INDEX IF NOT EXISTS audit_session ON audit(endpoint, session_id, status);
CREATE INDEX IF NOT EXISTS audit_group ON audit(fail_group, endpoint) WHERE fail_group IS NOT NULL;
CREATE INDEX IF NOT EXISTS audit_handoff_due ON audit(expected_by)
  WHERE status = 'Pending' AND sub_status = 'Handoff' AND expected_by IS NOT NULL AND overdue_at IS NULL;
CREATE TABLE IF NOT EXISTS history (
  id INTEGER PRIMARY KEY, endpoint TEXT NOT NULL, event_id TEXT NOT NULL,
  message_id TEXT, message_type TEXT, status TEXT, detail TEXT, at INTEGER NOT NULL,
  error_text TEXT, error_type TEXT, error_stack TEXT, previous_payload TEXT);
CREATE INDEX IF NOT EXISTS history_event ON history(event_id);
CREATE TABLE IF NOT EXISTS processed (
  endpoint TEXT NOT NULL, message_id TEXT NOT NULL, event_id TEXT NOT NULL, at INTEGER NOT NULL,
  PRIMARY KEY (endpoint, message_id, event_id)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS processed_at ON processed(at);
`);

// The host's statements (host/src/store/nh_store.c), with anonymous parameters (better-sqlite3
// refuses ?NNN ones given positionally): created_at and updated_at are both `now`, as the host's ?18.
const auditPut = db.prepare(
  'INSERT INTO audit(endpoint, event_id, session_id, event_type, status, sub_status, error_text, error_type,' +
  ' handoff_reason, external_job_id, expected_by, message_id, correlation_id, originating_message_id,' +
  ' retry_count, payload, result, created_at, updated_at, error_stack, fail_group, attempts, queue_time_ms,' +
  ' processing_time_ms, overdue_at, traceparent)' +
  ' VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)' +
  ' ON CONFLICT(event_id, endpoint) DO UPDATE SET session_id=excluded.session_id,' +
  ' event_type=excluded.event_type, status=excluded.status, sub_status=excluded.sub_status,' +
  ' error_text=excluded.error_text, error_type=excluded.error_type, handoff_reason=excluded.handoff_reason,' +
  ' external_job_id=excluded.external_job_id, expected_by=excluded.expected_by,' +
  ' message_id=excluded.message_id, correlation_id=excluded.correlation_id,' +
  ' originating_message_id=excluded.originating_message_id, retry_count=excluded.retry_count,' +
  ' payload=excluded.payload, result=excluded.result, updated_at=excluded.updated_at,' +
  ' error_stack=excluded.error_stack, fail_group=excluded.fail_group, attempts=excluded.attempts,' +
  ' queue_time_ms=excluded.queue_time_ms, processing_time_ms=excluded.processing_time_ms,' +
  ' overdue_at=excluded.overdue_at, traceparent=excluded.traceparent');
const historyAdd = db.prepare(
  'INSERT INTO history(endpoint, event_id, message_id, message_type, status, detail, at, error_text, error_type,' +
  ' error_stack, previous_payload) VALUES (?,?,?,?,?,?,?,?,?,?,?)');
const processedAdd = db.prepare(
  'INSERT OR IGNORE INTO processed(endpoint, message_id, event_id, at) VALUES (?,?,?,?)');

// nh_amqp_event_id (host/src/transport/nh_amqp_msg.c)
const NS = Buffer.from([0x6f, 0x1c, 0x2b, 0x0e, 0x8a, 0x2d, 0x4b, 0x7e,
                        0x9c, 0x55, 0x2d, 0x1f, 0x0e, 0x7a, 0x9b, 0x31]);
function eventId(messageId, createdMs) {
  const md = crypto.createHash('sha1').update(NS).update(ENDPOINT + '\n' + messageId).digest();
  if (createdMs > 0) {
    md.writeUIntBE(createdMs, 0, 6);
    md[6] = (md[6] & 0x0f) | 0x80;
  } else {
    md[6] = (md[6] & 0x0f) | 0x50;
  }
  md[8] = (md[8] & 0x3f) | 0x80;
  const h = md.toString('hex', 0, 16);
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20, 32)}`;
}

function bodyText(body) {
  if (body == null) return null;
  if (typeof body === 'string') return body;
  if (Buffer.isBuffer(body)) return body.toString('utf8');
  if (body.content !== undefined) return bodyText(body.content);   // a data section
  return JSON.stringify(body);
}

const str = (v) => (v == null ? null : String(v));

// The trivial handler (the host's bench adapter: a function that returns).
function handler(_event) {}

const writeBatch = db.transaction((batch) => {
  const trace = crypto.randomBytes(24 * batch.length).toString('hex');
  for (let i = 0; i < batch.length; i++) {
    const m = batch[i].message;
    const props = m.application_properties || {};
    const messageId = str(m.message_id);
    const created = m.creation_time ? m.creation_time.getTime() : 0;
    const evId = str(props.EventId) || eventId(messageId, created);
    const sessionId = str(m.group_id) || messageId;
    const eventType = str(props.EventTypeId) || str(m.subject);
    const orig = props.OriginatingMessageId === 'self' ? null : str(props.OriginatingMessageId);
    const payload = bodyText(m.body);
    const start = Date.now();
    handler({ eventId: evId, sessionId, eventType, payload });
    const now = Date.now();
    const tp = `00-${trace.slice(48 * i, 48 * i + 32)}-${trace.slice(48 * i + 32, 48 * i + 48)}-01`;
    auditPut.run(ENDPOINT, evId, sessionId, eventType, 'Completed', null, null, null, null, null, null, messageId,
                 str(m.correlation_id), orig, Number(props.RetryCount || 0), payload, null, now, now, null, null, 0,
                 created > 0 ? Math.max(0, start - created) : null, now - start, null, tp);
    historyAdd.run(ENDPOINT, evId, messageId, str(props.MessageType) || 'EventRequest', 'Completed',
                   'handler completed', now, null, null, null, null);
    processedAdd.run(ENDPOINT, messageId, evId, now);
  }
});

// ------------------------------------------------------------------ AMQP
const u = new URL(url);
if (u.protocol !== 'amqp:') die('only amqp:// URLs: ' + url);
const vhost = decodeURIComponent(u.pathname.replace(/^\//, ''));
const container = rhea.create_container({ id: 'nimbus-bench-node-peer' });
const conn = container.connect({
  host: u.hostname, port: Number(u.port || 5672),
  username: decodeURIComponent(u.username || 'guest'), password: decodeURIComponent(u.password || 'guest'),
  hostname: vhost ? 'vhost:' + vhost : undefined, reconnect: false, idle_time_out: 60000,
});
const receiver = conn.open_receiver({
  source: { address: '/amq/queue/' + queue }, autoaccept: false, credit_window: 0, rcv_settle_mode: 0,
});

let pending = [];
let scheduled = false;
let stopping = false;
const stats = { received: 0, committed: 0, batches: 0, max_batch: 0, ready_ms: null, last_commit_ms: null };

function topup() {
  if (stopping || !receiver.is_open()) return;
  const have = pending.length + Math.max(0, receiver.credit);
  if (have <= WINDOW / 2) receiver.add_credit(WINDOW - have);
}

function flush() {
  scheduled = false;
  while (pending.length) {
    const batch = pending.length > BATCH ? pending.splice(0, BATCH) : pending;
    if (batch === pending) pending = [];
    try {
      writeBatch(batch);   // rolled back on failure: nothing is accepted, the broker redelivers
    } catch (e) {
      die('writing a batch of ' + batch.length + ': ' + e.message);
    }
    for (const d of batch) d.delivery.accept();
    stats.committed += batch.length;
    stats.batches++;
    if (batch.length > stats.max_batch) stats.max_batch = batch.length;
    stats.last_commit_ms = sinceStart();
  }
  topup();
}

receiver.on('receiver_open', () => {
  stats.ready_ms = sinceStart();
  process.stderr.write(`ready: receiving from /amq/queue/${queue} (window ${WINDOW}, batch ${BATCH}) ` +
                       `into ${dbPath} (sqlite ${db.prepare('select sqlite_version() v').get().v})\n`);
  topup();
});

receiver.on('message', (ctx) => {
  stats.received++;
  pending.push({ message: ctx.message, delivery: ctx.delivery });
  if (pending.length >= BATCH) flush();
  else if (!scheduled) {
    scheduled = true;
    setImmediate(flush);
  }
});

for (const ev of ['receiver_error', 'connection_error']) {
  conn.on(ev, (ctx) => die(`${ev}: ${JSON.stringify((ctx.receiver || ctx.connection).error || null)}`));
}
conn.on('disconnected', (ctx) => {
  if (!stopping) die('disconnected: ' + (ctx.error ? ctx.error.message || ctx.error : 'by the broker'));
});

function finish() {
  if (stopping) return;
  if (pending.length) flush();
  stopping = true;
  const cpu = process.cpuUsage();
  const out = Object.assign({}, stats, {
    cpu_s: (cpu.user + cpu.system) / 1e6, max_rss_kb: process.resourceUsage().maxRSS,
    sqlite: db.prepare('select sqlite_version() v').get().v, node: process.version,
  });
  let closed = false;
  const done = () => {
    if (closed) return;
    closed = true;
    try { db.close(); } catch (e) { /* exiting anyway */ }
    process.stdout.write(JSON.stringify(out) + '\n', () => process.exit(0));
  };
  setTimeout(done, 3000).unref();   // a broker that does not answer the close
  conn.once('connection_close', done);
  conn.close();
}
process.on('SIGTERM', finish);
process.on('SIGINT', finish);
