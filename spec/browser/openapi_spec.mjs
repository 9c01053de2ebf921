// The operator API against its OpenAPI document (console/openapi.json): a real host with the
// fixture adapter (fixtures/openapi/orders.lua) and events in every state it can show, every
// route driven over real HTTP, its good answers and its errors (400 with field, 401, 403, 404,
// 405, 409, 413, 415, 429), and each answer's status and body validated against the document
// (ajv, JSON Schema 2020-12): a status the operation does not list, or a body its schema does
// not accept, fails. GET /api/v1/openapi.json must be the file byte for byte.
//
//   NIMBUS_HOST=build/host/nimbus-host NIMBUS_SOURCE_DIR=$PWD node --test spec/browser/openapi_spec.mjs
import { test, describe, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import http from "node:http";
import { fileURLToPath } from "node:url";
import Ajv2020 from "ajv/dist/2020.js";
import addFormats from "ajv-formats";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const SOURCE = process.env.NIMBUS_SOURCE_DIR || path.resolve(HERE, "../..");
const BIN = process.env.NIMBUS_HOST || path.join(SOURCE, "build/host/nimbus-host");
const DOC_PATH = path.join(SOURCE, "console/openapi.json");
const ADAPTER = path.join(HERE, "fixtures/openapi/orders.lua");
const DEADLINE_MS = 20000;
const POLL_MS = 25;

const DOC_TEXT = fs.readFileSync(DOC_PATH, "utf8");
const DOC = JSON.parse(DOC_TEXT);

// ------------------------------------------------------------------ the document as schemas

const DOC_ID = "urn:nimbus-host:openapi";
// strictRequired is off: an anyOf of `required` lists names members its parent declares
const ajv = new Ajv2020({ allErrors: true, strict: true, strictRequired: false });
addFormats(ajv);
// The document's own members are not JSON Schema keywords: annotations, so the schemas
// inside it are compiled where they are referenced and the rest is left alone.
ajv.addVocabulary(["openapi", "info", "servers", "tags", "security", "paths", "components", "webhooks",
                   "jsonSchemaDialect", "externalDocs"]);
ajv.addSchema({ $id: DOC_ID, ...DOC });

const escapePointer = (s) => s.replaceAll("~", "~0").replaceAll("/", "~1");
const validators = new Map();
function validatorAt(pointer) {   // pointer: "#/components/schemas/Event"
  if (!validators.has(pointer)) validators.set(pointer, ajv.compile({ $ref: DOC_ID + pointer }));
  return validators.get(pointer);
}
function resolveRef(ref) {
  let node = DOC;
  for (const part of ref.replace(/^#\//, "").split("/")) node = node[part.replaceAll("~1", "/").replaceAll("~0", "~")];
  assert.ok(node, `the document's ${ref} points at nothing`);
  return node;
}
function assertValid(pointer, value, what) {
  const v = validatorAt(pointer);
  if (!v(value)) {
    assert.fail(`${what} does not match ${pointer}:\n${ajv.errorsText(v.errors, { separator: "\n" })}\n` +
                `value: ${JSON.stringify(value).slice(0, 2000)}`);
  }
}

// Path templates of the document as regular expressions ("/api/v1/events/{id}" -> one segment).
const TEMPLATES = Object.keys(DOC.paths).map((t) => ({
  template: t,
  re: new RegExp("^" + t.replace(/[.*+?^$()|[\]\\]/g, "\\$&").replace(/\{[^}]+\}/g, "[^/]+") + "$"),
}));
const templateOf = (p) => TEMPLATES.find((t) => t.re.test(p.split("?")[0]))?.template;

// What was exercised: "METHOD template status".
const covered = new Set();

// Checks one answer against the document: the operation lists its status, the body has
// the documented media type and matches the documented schema, required headers are there.
function checkAnswer(method, template, res) {
  const m = method.toLowerCase();
  const op = DOC.paths[template]?.[m];
  assert.ok(op, `${method} ${template} is not in the document`);
  let resp = op.responses[String(res.status)];
  let pointer = `#/paths/${escapePointer(template)}/${m}/responses/${res.status}`;
  assert.ok(resp, `${method} ${res.path} answered ${res.status}, a status the document does not list for it ` +
                  `(${Object.keys(op.responses).join(", ")}); body: ${res.text.slice(0, 500)}`);
  if (resp.$ref) {
    pointer = resp.$ref;
    resp = resolveRef(resp.$ref);
  }
  const types = Object.keys(resp.content || {});
  const ctype = (res.headers["content-type"] || "").split(";")[0].trim();
  assert.ok(types.includes(ctype), `${method} ${res.path} ${res.status}: Content-Type ${ctype || "(none)"}, ` +
                                   `documented ${types.join(", ") || "(no body)"}`);
  if (ctype === "application/json") {
    let body;
    try {
      body = JSON.parse(res.text);
    } catch (e) {
      assert.fail(`${method} ${res.path} ${res.status}: the body is not JSON: ${res.text.slice(0, 500)}`);
    }
    assertValid(`${pointer}/content/application~1json/schema`, body, `${method} ${res.path} ${res.status}`);
  }
  for (const [name, h] of Object.entries(resp.headers || {})) {
    const got = res.headers[name.toLowerCase()];
    if (h.required) assert.ok(got !== undefined, `${method} ${res.path} ${res.status}: no ${name} header`);
    if (got !== undefined && h.schema) {
      assert.ok(ajv.validate(h.schema, got), `${method} ${res.path} ${res.status}: header ${name}: ${got}`);
    }
  }
  covered.add(`${method} ${template} ${res.status}`);
}

// A request the document describes as valid: its body matches the documented request body.
function checkRequest(method, template, body) {
  const m = method.toLowerCase();
  const rb = DOC.paths[template][m].requestBody;
  if (body === undefined) {
    assert.ok(!rb?.required, `${method} ${template}: the document requires a body`);
    return;
  }
  assert.ok(rb, `${method} ${template}: the document takes no body`);
  assertValid(`#/paths/${escapePointer(template)}/${m}/requestBody/content/application~1json/schema`, body,
              `the request body of ${method} ${template}`);
}

// ------------------------------------------------------------------ HTTP

const BIG = 1 << 20;   // bodies from this size wait for 100 Continue (see request)

function request(port, method, pth, { body, headers = {}, raw } = {}) {
  const payload = raw !== undefined ? raw : body !== undefined ? JSON.stringify(body) : undefined;
  const h = { ...headers };
  if (payload !== undefined && !Object.keys(h).some((k) => k.toLowerCase() === "content-type")) {
    h["Content-Type"] = "application/json";
  }
  // The server answers 413 from the headers and closes; a client still writing then gets
  // EPIPE before it reads the answer. Asking for 100 Continue first is what HTTP has for it.
  const big = payload !== undefined && Buffer.byteLength(payload) >= BIG;
  if (big) h.Expect = "100-continue";
  return new Promise((resolve, reject) => {
    let answered = false;
    const req = http.request({ host: "127.0.0.1", port, method, path: pth, headers: h, agent: false }, (res) => {
      answered = true;
      const chunks = [];
      res.on("data", (c) => chunks.push(c));
      res.on("end", () => resolve({ status: res.statusCode, headers: res.headers, path: pth,
                                    text: Buffer.concat(chunks).toString("utf8") }));
      res.on("error", reject);
    });
    req.setTimeout(30000, () => req.destroy(new Error(`${method} ${pth}: no answer in 30 s`)));
    req.on("error", (e) => {
      if (!answered) reject(new Error(`${method} ${pth}: ${e.code || e.message} before an answer`));
    });
    if (big) req.on("continue", () => req.end(payload));
    else req.end(payload);
  });
}
// A stream's status and headers (an error answer's body too); the stream itself is closed.
function streamHead(port, pth, headers = {}) {
  return new Promise((resolve, reject) => {
    const req = http.get({ host: "127.0.0.1", port, path: pth, headers, agent: false }, (res) => {
      if (res.statusCode === 200) {
        resolve({ status: 200, headers: res.headers, path: pth, text: "" });
        req.destroy();
        return;
      }
      let text = "";
      res.on("data", (d) => (text += d));
      res.on("end", () => resolve({ status: res.statusCode, headers: res.headers, path: pth, text }));
    });
    req.setTimeout(30000, () => req.destroy(new Error(`GET ${pth}: no answer in 30 s`)));
    req.on("error", reject);
  });
}
const json = (res) => JSON.parse(res.text);

async function eventually(what, fn, ms = DEADLINE_MS) {
  const deadline = Date.now() + ms;
  let last;
  for (;;) {
    try {
      last = await fn();
      if (last) return last;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) assert.fail(`${what}: not within ${ms} ms (last: ${last?.stack || JSON.stringify(last)})`);
    await new Promise((r) => setTimeout(r, POLL_MS));
  }
}

// ------------------------------------------------------------------ hosts

class Host {
  constructor(args, { dir }) {
    this.log = "";
    this.proc = spawn(BIN, args, { cwd: dir, stdio: ["ignore", "pipe", "pipe"] });
    for (const s of [this.proc.stdout, this.proc.stderr]) s.on("data", (d) => (this.log += d));
    this.exited = new Promise((r) => this.proc.on("exit", (code, sig) => r(code ?? 128 + (os.constants.signals[sig] || 0))));
  }
  async started(readyLine) {
    await eventually(`the host to log its listener${readyLine ? " and " + readyLine : ""}`, () => {
      if (this.proc.exitCode !== null) assert.fail(`the host exited ${this.proc.exitCode}:\n${this.log}`);
      const m = this.log.match(/operator API on http:\/\/127\.0\.0\.1:(\d+)\/api\/v1\//);
      return m && (!readyLine || this.log.includes(readyLine)) && (this.port = Number(m[1]));
    });
    return this;
  }
  async stop() {
    if (this.proc.exitCode !== null) return;
    this.proc.kill("SIGTERM");
    const timer = setTimeout(() => this.proc.kill("SIGKILL"), 15000);
    await this.exited;
    clearTimeout(timer);
  }
}

// One API client on a host: each call fills the path template, checks the answer against
// the document and, when `expect` says, its status.
function client(host, defaults = {}) {
  return async function call(method, template, { params = {}, query = "", expect, ...opts } = {}) {
    const pth = template.replace(/\{([^}]+)\}/g, (_, k) => encodeURIComponent(params[k])) + query;
    const headers = { ...defaults.headers, ...opts.headers };
    const res = await request(host.port, method, pth, { ...opts, headers });
    checkAnswer(method, template, res);
    if (expect !== undefined) {
      assert.equal(res.status, expect, `${method} ${pth}: ${res.status} ${res.text.slice(0, 500)}`);
    }
    if (expect >= 200 && expect < 300 && opts.raw === undefined) checkRequest(method, template, opts.body);
    res.json = res.headers["content-type"]?.startsWith("application/json") ? json(res) : undefined;
    return res;
  };
}

// ------------------------------------------------------------------ the spec

describe("the operator API matches console/openapi.json", () => {
  let dir, store, host, call;
  const NIMBUS = { headers: { "api-version": "2" } };

  function publish(type, payload, session) {
    const out = execFileSync(BIN, ["publish", type, JSON.stringify(payload), "--session", session, "--store", store],
                             { cwd: dir, encoding: "utf8" });
    return out.trim().split(/\s+/)[0];
  }
  // The event of `session` (the first, or the one whose payload tag is `tag`) once pred says so.
  async function eventOf(session, pred, what) {
    return eventually(`session ${session}: ${what}`, async () => {
      const res = await call("GET", "/api/v1/events", { query: `?session=${encodeURIComponent(session)}`, expect: 200 });
      return res.json.events.find(pred);
    });
  }
  const withStatus = (status, sub) => (e) => e.status === status && (sub === undefined || e.sub_status === sub);
  async function settled(id, status) {   // the request applied: none waiting, the status reached
    return eventually(`event ${id} to be ${status}`, async () => {
      const res = await call("GET", "/api/v1/events/{id}", { params: { id }, expect: 200 });
      return !res.json.request_waiting && res.json.status === status && res.json;
    });
  }

  const seeded = {};
  before(async () => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), "nh-openapi-"));
    store = path.join(dir, "nimbus.db");
    host = await new Host([ADAPTER, "--store", store, "--admin", "127.0.0.1:0"], { dir }).started("ready:");
    call = client(host);
    const ev = (tag, extra = {}) => ({ tag, ...extra });
    publish("OrderPlaced", ev("ok1"), "c1");
    publish("OrderChanged", ev("ok2"), "c2");
    publish("OrderPlaced", ev("resub", { fail_times: 1 }), "r1");
    publish("OrderPlaced", ev("skip", { fail: true }), "k1");
    publish("OrderPlaced", ev("block", { fail: true, message: "warehouse offline" }), "b1");
    publish("OrderChanged", ev("parked"), "b1");
    publish("OrderPlaced", ev("h-done", { handoff: "Awaiting approval" }), "h1");
    publish("OrderPlaced", ev("h-fail", { handoff: "Awaiting approval" }), "h2");
    publish("OrderPlaced", ev("nb-resub", { fail_times: 1 }), "n1");
    publish("OrderPlaced", ev("nb-skip", { fail: true }), "n2");
    for (let i = 1; i <= 3; i++) publish("OrderPlaced", ev("bulk" + i, { fail: true, message: "bulk-doom" }), "u" + i);
    seeded.ok = await eventOf("c1", withStatus("Completed"), "Completed");
    seeded.resub = await eventOf("r1", withStatus("Failed"), "Failed");
    seeded.skip = await eventOf("k1", withStatus("Failed"), "Failed");
    seeded.block = await eventOf("b1", withStatus("Failed"), "Failed");
    seeded.parked = await eventOf("b1", withStatus("Deferred"), "Deferred");
    seeded.hDone = await eventOf("h1", withStatus("Pending", "Handoff"), "Pending+Handoff");
    seeded.hFail = await eventOf("h2", withStatus("Pending", "Handoff"), "Pending+Handoff");
    seeded.nResub = await eventOf("n1", withStatus("Failed"), "Failed");
    seeded.nSkip = await eventOf("n2", withStatus("Failed"), "Failed");
    for (let i = 1; i <= 3; i++) await eventOf("u" + i, withStatus("Failed"), "Failed");
  });

  after(async () => {
    await host?.stop();
    if (dir && !process.env.NH_KEEP) fs.rmSync(dir, { recursive: true, force: true });
  });

  test("the document is a well-formed OpenAPI 3.1 document whose schemas compile", () => {
    assert.match(DOC.openapi, /^3\.1\.\d+$/);
    const ids = new Set();
    for (const [t, item] of Object.entries(DOC.paths)) {
      for (const [m, op] of Object.entries(item)) {
        assert.ok(["get", "post"].includes(m), `${m} ${t}`);
        assert.ok(op.operationId && !ids.has(op.operationId), `${m} ${t}: operationId ${op.operationId}`);
        ids.add(op.operationId);
        const inPath = [...t.matchAll(/\{([^}]+)\}/g)].map((x) => x[1]).sort();
        const declared = (op.parameters || []).filter((x) => x.in === "path").map((x) => x.name).sort();
        assert.deepEqual(declared, inPath, `${m} ${t}: path parameters`);
        for (const [status, r] of Object.entries(op.responses)) {
          assert.ok((r.$ref ? resolveRef(r.$ref) : r).description, `${m} ${t} ${status}: no description`);
        }
      }
    }
    for (const name of Object.keys(DOC.components.schemas)) validatorAt(`#/components/schemas/${escapePointer(name)}`);
    for (const [t, item] of Object.entries(DOC.paths)) {
      for (const [m, op] of Object.entries(item)) {
        assert.ok(Object.keys(op.responses).length, `${m} ${t}: no responses`);
        const base = `#/paths/${escapePointer(t)}/${m}`;
        if (op.requestBody?.content?.["application/json"]) validatorAt(`${base}/requestBody/content/application~1json/schema`);
        for (const [status, r] of Object.entries(op.responses)) {
          const resp = r.$ref ? resolveRef(r.$ref) : r;
          const ptr = r.$ref ? r.$ref : `${base}/responses/${status}`;
          if (resp.content?.["application/json"]) validatorAt(`${ptr}/content/application~1json/schema`);
        }
      }
    }
  });

  test("GET /api/v1/openapi.json is console/openapi.json", async () => {
    const res = await call("GET", "/api/v1/openapi.json", { expect: 200 });
    assert.equal(res.text, DOC_TEXT);
  });

  test("health and readiness", async () => {
    await call("GET", "/healthz", { expect: 200 });
    await call("GET", "/readyz", { expect: 200 });
  });

  test("whoami on loopback: local, an operator, no login", async () => {
    const res = await call("GET", "/api/v1/whoami", { expect: 200 });
    assert.equal(res.json.name, "local");
    assert.equal(res.json.role, "operator");
    assert.equal(res.json.login_required, false);
  });

  test("reads: endpoints, events (filtered, paged), one event, sessions, failures", async () => {
    const eps = await call("GET", "/api/v1/endpoints", { expect: 200 });
    const orders = eps.json.endpoints.find((e) => e.endpoint === "Orders");
    assert.ok(orders.counts.Failed >= 1 && orders.counts.Deferred === 1, JSON.stringify(orders));
    // pages without gaps or repeats
    const seen = new Set();
    let after = null;
    do {
      const res = await call("GET", "/api/v1/events", { query: `?limit=4${after ? "&after=" + after : ""}`, expect: 200 });
      for (const e of res.json.events) {
        assert.ok(!seen.has(e.event_id), `repeated ${e.event_id}`);
        seen.add(e.event_id);
      }
      after = res.json.next;
    } while (after);
    assert.ok(seen.size >= 13, `${seen.size} events`);
    await call("GET", "/api/v1/events", { query: "?status=failed,deferred&type=OrderPlaced,OrderChanged&order=newest", expect: 200 });
    await call("GET", "/api/v1/events", { query: "?endpoint=Orders&error=WAREHOUSE&since=1h&payload=block", expect: 200 });
    const one = await call("GET", "/api/v1/events/{id}", { params: { id: seeded.block.event_id }, expect: 200 });
    assert.equal(one.json.payload.tag, "block");
    assert.ok(one.json.history.some((h) => h.status === "Failed" && h.error_text), JSON.stringify(one.json.history));
    const prefix = await call("GET", "/api/v1/events/{id}", { params: { id: seeded.block.event_id.slice(0, 12) }, expect: 200 });
    assert.equal(prefix.json.event_id, seeded.block.event_id);
    const sessions = await call("GET", "/api/v1/sessions", { query: "?endpoint=Orders&limit=1000", expect: 200 });
    const b1 = sessions.json.sessions.find((s) => s.session_id === "b1");
    assert.equal(b1?.blocked_by, seeded.block.event_id);
    assert.equal(b1.parked, 1);
    const paged = await call("GET", "/api/v1/sessions", { query: "?limit=1", expect: 200 });
    if (paged.json.next) await call("GET", "/api/v1/sessions", { query: `?limit=1&after=${encodeURIComponent(paged.json.next)}`, expect: 200 });
    const failures = await call("GET", "/api/v1/failures", { query: "?endpoint=Orders", expect: 200 });
    assert.ok(failures.json.groups.length >= 1);
  });

  test("reads: 400 naming the parameter, 404 unknown event", async () => {
    const bad = async (template, query, field, params) => {
      const res = await call("GET", template, { query, params, expect: 400 });
      assert.equal(res.json.field, field, res.text);
    };
    await bad("/api/v1/events", "?status=bogus", "status");
    await bad("/api/v1/events", "?limit=0", "limit");
    await bad("/api/v1/events", "?order=sideways", "order");
    await bad("/api/v1/events", "?since=yesterday", "since");
    await bad("/api/v1/events", "?colour=red", "colour");
    await bad("/api/v1/events", "?endpoint=NoSuchEndpoint", "endpoint");
    await bad("/api/v1/endpoints", "?colour=red", "colour");
    await bad("/api/v1/sessions", "?limit=-1", "limit");
    await bad("/api/v1/failures", "?colour=red", "colour");
    await bad("/api/v1/events/{id}", "?colour=red", "colour", { id: seeded.block.event_id });
    await call("GET", "/api/v1/events/{id}", { params: { id: "00000000-0000-0000-0000-000000000000" }, expect: 404 });
  });

  test("unknown routes answer 404, other methods 405, both as documented errors", async () => {
    for (const [method, pth, status] of [["GET", "/api/v1/nothing", 404], ["POST", "/api/v2/events", 404],
                                         ["DELETE", "/api/v1/events", 405], ["PUT", "/api/v1/whoami", 405],
                                         ["GET", "/api/v1/bulk/skip", 405]]) {
      const res = await request(host.port, method, pth);
      assert.equal(res.status, status, `${method} ${pth}: ${res.text}`);
      const template = templateOf(pth);
      if (status === 404) assert.equal(template, undefined, `${pth} is in the document`);
      else assert.ok(template && !DOC.paths[template][method.toLowerCase()], `${method} ${pth} is in the document`);
      assertValid("#/components/schemas/Error", json(res), `${method} ${pth}`);
    }
  });

  test("resubmit: 202, then 409 with the event; 404, 400 with field, 415, 403 foreign Origin, 405, 413", async () => {
    const T = "/api/v1/events/{id}/resubmit";
    const id = seeded.resub.event_id;
    const queued = await call("POST", T, { params: { id }, body: { body: { tag: "resub", fixed: true } }, expect: 202 });
    assert.equal(queued.json.queued, "resubmit");
    assert.equal(queued.json.live_hosts, 1);
    const again = await call("POST", T, { params: { id }, body: {}, expect: 409 });   // one waits already, or it is done
    assert.equal(again.json.event.event_id, id);
    await settled(id, "Completed");
    const done = await call("POST", T, { params: { id }, body: {}, expect: 409 });   // Completed needs force
    assert.equal(done.json.event.status, "Completed");
    await call("POST", T, { params: { id: "00000000-0000-0000-0000-000000000000" }, body: {}, expect: 404 });
    const target = { params: { id: seeded.block.event_id } };
    assert.equal((await call("POST", T, { ...target, body: { colour: 1 }, expect: 400 })).json.field, "colour");
    assert.equal((await call("POST", T, { ...target, body: { body: "text" }, expect: 400 })).json.field, "body");
    assert.equal((await call("POST", T, { ...target, body: { force: "yes" }, expect: 400 })).json.field, "force");
    await call("POST", T, { ...target, raw: "{not json", expect: 400 });
    await call("POST", T, { ...target, raw: "{}", headers: { "Content-Type": "text/plain" }, expect: 415 });
    await call("POST", T, { ...target, body: {}, headers: { Origin: "http://evil.example" }, expect: 403 });
    const big = JSON.stringify({ body: { blob: "x".repeat(11 * 1024 * 1024) } });
    await call("POST", T, { ...target, raw: big, headers: { "Content-Type": "application/json" }, expect: 413 });
    const get = await request(host.port, "GET", `/api/v1/events/${seeded.block.event_id}/resubmit`);
    assert.equal(get.status, 405);
    assertValid("#/components/schemas/Error", json(get), "GET on an action");
    const still = await call("GET", "/api/v1/events/{id}", { ...target, expect: 200 });
    assert.equal(still.json.status, "Failed");   // none of the refused ones did anything
    assert.equal(still.json.request_waiting, false);
  });

  test("skip: 202 with a reason, in the operator log; 409 once Skipped", async () => {
    const T = "/api/v1/events/{id}/skip";
    const id = seeded.skip.event_id;
    const res = await call("POST", T, { params: { id }, body: { reason: "duplicate order" }, expect: 202 });
    assert.equal(res.json.queued, "skip");
    const ev = await settled(id, "Skipped");
    assert.ok(ev.operator_log.some((l) => l.action === "skip" && l.actor === "local"), JSON.stringify(ev.operator_log));
    await call("POST", T, { params: { id }, body: {}, expect: 409 });
    assert.equal((await call("POST", T, { params: { id }, body: { reason: 7 }, expect: 400 })).json.field, "reason");
  });

  test("hand-offs: complete and fail, 400 without error or reason, 409 when not a hand-off", async () => {
    const C = "/api/v1/events/{id}/handoff/complete";
    const F = "/api/v1/events/{id}/handoff/fail";
    await call("POST", C, { params: { id: seeded.hDone.event_id }, body: { result: { approved: true } }, expect: 202 });
    await settled(seeded.hDone.event_id, "Completed");
    const failId = seeded.hFail.event_id;
    assert.equal((await call("POST", F, { params: { id: failId }, body: { error: "rejected" }, expect: 400 })).json.field,
                 "reason");
    assert.equal((await call("POST", F, { params: { id: failId }, body: { reason: "manager said no" }, expect: 400 }))
                 .json.field, "error");
    await call("POST", F, { params: { id: failId }, body: { error: "rejected", reason: "manager said no" }, expect: 202 });
    await settled(failId, "Failed");
    await call("POST", C, { params: { id: seeded.ok.event_id }, body: {}, expect: 409 });
    await call("POST", F, { params: { id: seeded.ok.event_id }, body: { error: "e", reason: "r" }, expect: 409 });
    await call("POST", C, { params: { id: "00000000-0000-0000-0000-000000000000" }, body: {}, expect: 404 });
  });

  test("NimBus-compatible routes: counts, getByFilter pages, resubmit and skip with lastMessageId", async () => {
    const counts = await call("POST", "/api/endpoint/status/count", { ...NIMBUS, body: ["Orders", "Quiet"], expect: 200 });
    assert.equal(counts.json[0].endpointId, "Orders");
    assert.equal(counts.json[1].failedCount, 0);
    const G = "/api/event/{endpoint}/getByFilter";
    const seen = new Set();
    let token = "";
    do {
      const res = await call("POST", G, { ...NIMBUS, params: { endpoint: "Orders" }, expect: 200,
                                          body: { continuationToken: token, eventFilter: {}, maxSearchItemsCount: 3 } });
      for (const e of res.json.events) {
        assert.ok(!seen.has(e.eventId), `repeated ${e.eventId}`);
        seen.add(e.eventId);
      }
      token = res.json.continuationToken;
    } while (token);
    assert.ok(seen.size >= 13, `${seen.size} events`);
    const failed = await call("POST", G, { ...NIMBUS, params: { endpoint: "Orders" }, expect: 200, body: {
      continuationToken: null, maxSearchItemsCount: 100,
      eventFilter: { sessionId: "n1", eventId: null, resolutionStatus: ["Failed"], eventTypeId: ["OrderPlaced"], payload: "nb-" } } });
    assert.equal(failed.json.events.length, 1);
    const n1 = failed.json.events[0];
    assert.equal(n1.eventId, seeded.nResub.event_id);
    assert.match(n1.messageContent.errorContent.errorText, /nb-resub rejected/);
    const R = "/api/event/resubmit/{eventId}/{lastMessageId}";
    const S = "/api/event/skip/{eventId}/{lastMessageId}";
    const first = n1.lastMessageId;
    // no body at all (NimBus's clients send none), still as JSON like every POST
    await call("POST", R, { ...NIMBUS, params: { eventId: n1.eventId, lastMessageId: first }, raw: "", expect: 202 });
    await settled(n1.eventId, "Completed");
    const stale = await call("POST", S, { ...NIMBUS, params: { eventId: n1.eventId, lastMessageId: first }, body: {},
                                          expect: 409 });
    assert.match(stale.json.error, /moved on/);
    const n2 = seeded.nSkip;
    await call("POST", S, { ...NIMBUS, params: { eventId: n2.event_id, lastMessageId: n2.message_id }, body: {}, expect: 202 });
    await settled(n2.event_id, "Skipped");
    await call("POST", R, { ...NIMBUS, params: { eventId: "00000000-0000-0000-0000-000000000000", lastMessageId: first },
                            body: {}, expect: 404 });
    await call("POST", S, { ...NIMBUS, params: { eventId: "00000000-0000-0000-0000-000000000000", lastMessageId: first },
                            body: {}, expect: 404 });
  });

  test("NimBus-compatible routes: 400 naming the header or member, 404 unknown endpoint, 415, 403, 413", async () => {
    const G = "/api/event/{endpoint}/getByFilter";
    const C = "/api/endpoint/status/count";
    const orders = { endpoint: "Orders" };
    assert.equal((await call("POST", C, { body: ["Orders"], expect: 400 })).json.field, "api-version");
    assert.equal((await call("POST", C, { headers: { "api-version": "1" }, body: ["Orders"], expect: 400 })).json.field,
                 "api-version");
    assert.equal((await call("POST", G, { params: orders, body: {}, expect: 400 })).json.field, "api-version");
    const r0 = seeded.block;
    assert.equal((await call("POST", "/api/event/skip/{eventId}/{lastMessageId}", {
      params: { eventId: r0.event_id, lastMessageId: r0.message_id }, body: {}, expect: 400 })).json.field, "api-version");
    await call("POST", C, { ...NIMBUS, body: { endpoints: ["Orders"] }, expect: 400 });
    assert.equal((await call("POST", C, { ...NIMBUS, body: ["Orders", 7], expect: 400 })).json.field, "[1]");
    const bad = async (body, field) =>
      assert.equal((await call("POST", G, { ...NIMBUS, params: orders, body, expect: 400 })).json.field, field);
    await bad({ maxSearchItemsCount: 0 }, "maxSearchItemsCount");
    await bad({ continuationToken: "nope" }, "continuationToken");
    await bad({ eventFilter: { resolutionStatus: ["Bogus"] } }, "eventFilter.resolutionStatus");
    await bad({ eventFilter: { colour: "red" } }, "eventFilter.colour");
    await bad({ colour: "red" }, "colour");
    await call("POST", G, { ...NIMBUS, params: { endpoint: "NoSuchEndpoint" }, body: {}, expect: 404 });
    await call("POST", C, { headers: { ...NIMBUS.headers, "Content-Type": "text/plain" }, raw: "[]", expect: 415 });
    await call("POST", C, { headers: { ...NIMBUS.headers, Origin: "http://evil.example" }, body: [], expect: 403 });
    await call("POST", G, { ...NIMBUS, params: orders, raw: JSON.stringify({ pad: "x".repeat(11 * 1024 * 1024) }),
                            expect: 413 });
  });

  test("bulk: a dry run's count and sample, a real run, 400 without a bound, 429 past six a minute", async () => {
    const S = "/api/v1/bulk/skip";
    const R = "/api/v1/bulk/resubmit";
    const filter = { endpoint: "Orders", status: "Failed", error: "bulk-doom" };
    const dry = await call("POST", S, { body: { filter, dry_run: true }, expect: 200 });
    assert.equal(dry.json.matched, 3);
    assert.equal(dry.json.sample.length, 3);
    await call("POST", R, { body: { filter: { status: ["Failed"], type: "OrderPlaced" }, dry_run: true, force: false },
                            expect: 200 });
    const real = await call("POST", S, { body: { filter, dry_run: false, reason: "cleanup" }, expect: 200 });
    assert.equal(real.json.queued, 3);
    assert.equal(real.json.endpoints[0].endpoint, "Orders");
    for (let i = 1; i <= 3; i++) await eventOf("u" + i, withStatus("Skipped"), "Skipped");
    assert.equal((await call("POST", S, { body: { filter: { session: "u1" }, dry_run: true }, expect: 400 })).json.field,
                 "filter");
    assert.equal((await call("POST", S, { body: { filter: { endpoint: "Orders", colour: 1 }, dry_run: true }, expect: 400 }))
                 .json.field, "colour");
    assert.equal((await call("POST", S, { body: { dry_run: true }, expect: 400 })).json.field, "filter");
    assert.equal((await call("POST", R, { body: { filter, dry_run: "no" }, expect: 400 })).json.field, "dry_run");
    await call("POST", S, { raw: "{}", headers: { "Content-Type": "text/plain" }, expect: 415 });
    await call("POST", S, { body: { filter, dry_run: true }, headers: { Origin: "http://evil.example" }, expect: 403 });
    await call("POST", S, { raw: JSON.stringify({ filter, dry_run: true, reason: "x".repeat(11 * 1024 * 1024) }),
                            expect: 413 });
    // six real runs a minute per identity (this test made one): the next ones are refused
    const none = { endpoint: "Orders", status: "DeadLettered" };
    let limited;
    for (let i = 0; i < 8 && !limited; i++) {
      const res = await call("POST", R, { body: { filter: none, dry_run: false } });
      if (res.status === 429) limited = res;
      else assert.equal(res.status, 200, res.text);
    }
    assert.ok(limited, "no 429 after eight real bulk runs");
    assert.match(limited.headers["retry-after"], /^\d+$/);
  });

  test("the stream: status and counts events carry the documented shapes", async () => {
    const T = "/api/v1/stream";
    const got = await new Promise((resolve, reject) => {
      const req = http.get({ host: "127.0.0.1", port: host.port, path: T + "?endpoint=Orders", agent: false }, (res) => {
        if (res.statusCode !== 200) {
          let text = "";
          res.on("data", (d) => (text += d));
          res.on("end", () => resolve({ res, text, events: [] }));
          return;
        }
        const events = [];
        let buf = "";
        const timer = setTimeout(() => { req.destroy(); resolve({ res, text: buf, events, timedOut: true }); }, DEADLINE_MS);
        res.on("data", (d) => {
          buf += d;
          let end;
          while ((end = buf.indexOf("\n\n")) >= 0) {
            const block = buf.slice(0, end);
            buf = buf.slice(end + 2);
            const name = block.match(/^event: (.*)$/m)?.[1];
            const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
            if (name) events.push({ name, data });
          }
          if (events.some((e) => e.name === "status") && events.some((e) => e.name === "counts")) {
            clearTimeout(timer);
            req.destroy();
            resolve({ res, text: "", events });
          }
        });
        publish("OrderPlaced", { tag: "streamed" }, "st1");   // a status change to tell
      });
      req.on("error", (e) => (e.code === "ECONNRESET" ? undefined : reject(e)));
    });
    checkAnswer("GET", T, { status: got.res.statusCode, headers: got.res.headers, path: T, text: got.text });
    assert.ok(!got.timedOut, `no status and counts events within ${DEADLINE_MS} ms: ${JSON.stringify(got.events)}`);
    for (const e of got.events) {
      if (e.name === "status") assertValid("#/components/schemas/Event", JSON.parse(e.data), "a status event");
      if (e.name === "counts") assertValid("#/components/schemas/Endpoints", JSON.parse(e.data), "a counts event");
    }
    for (const [query, field] of [["?endpoint=NoSuchEndpoint", "endpoint"], ["?colour=red", "colour"]]) {
      const bad = await streamHead(host.port, T + query);
      checkAnswer("GET", T, bad);
      assert.equal(bad.status, 400, bad.text);
      assert.equal(json(bad).field, field);
    }
  });

  describe("with logins (--admin-token-file)", () => {
    let console_, tokens;
    const READER = "reader-token-0123456789";
    const OPERATOR = "operator-token-0123456789";
    before(async () => {
      tokens = path.join(dir, "tokens");
      fs.writeFileSync(tokens, `# the spec's tokens\n${READER} reader ana\n${OPERATOR} operator otto\n`);
      console_ = await new Host(["console", "--store", store, "--admin", "127.0.0.1:0", "--admin-token-file", tokens],
                                { dir }).started();
    });
    after(async () => console_?.stop());

    test("401 without a token, 403 for a reader's action, whoami names the caller", async () => {
      const anon = client(console_);
      const reader = client(console_, { headers: { Authorization: `Bearer ${READER}` } });
      const operator = client(console_, { headers: { Authorization: `Bearer ${OPERATOR}` } });
      await anon("GET", "/api/v1/events", { expect: 401 });
      await anon("GET", "/api/v1/whoami", { expect: 401 });
      await client(console_, { headers: { Authorization: "Bearer not-a-token-at-all" } })("GET", "/api/v1/endpoints",
                                                                                          { expect: 401 });
      await anon("GET", "/healthz", { expect: 200 });
      await anon("GET", "/api/v1/openapi.json", { expect: 200 });
      await reader("GET", "/api/v1/events", { expect: 200 });
      const target = { params: { id: seeded.block.event_id }, body: {} };
      await anon("POST", "/api/v1/events/{id}/skip", { ...target, expect: 401 });
      await reader("POST", "/api/v1/events/{id}/skip", { ...target, expect: 403 });
      await reader("POST", "/api/v1/bulk/skip", { body: { filter: { endpoint: "Orders" }, dry_run: true }, expect: 403 });
      await reader("POST", "/api/event/skip/{eventId}/{lastMessageId}", {
        headers: { Authorization: `Bearer ${READER}`, "api-version": "2" },
        params: { eventId: seeded.block.event_id, lastMessageId: seeded.block.message_id }, body: {}, expect: 403 });
      await reader("POST", "/api/endpoint/status/count", {
        headers: { Authorization: `Bearer ${READER}`, "api-version": "2" }, body: ["Orders"], expect: 200 });
      await operator("POST", "/api/v1/events/{id}/resubmit", { params: { id: "00000000-0000-0000-0000-000000000000" },
                                                               body: {}, expect: 404 });
      const T = "/api/v1/stream";
      const denied = await streamHead(console_.port, T);
      checkAnswer("GET", T, denied);
      assert.equal(denied.status, 401);
      const stream = await streamHead(console_.port, `${T}?access_token=${READER}`);
      checkAnswer("GET", T, stream);
      assert.equal(stream.status, 200, "the stream refused its access_token");
      const who = await reader("GET", "/api/v1/whoami", { expect: 200 });
      assert.deepEqual([who.json.name, who.json.role, who.json.login_required], ["ana", "reader", true]);
      const op = await operator("GET", "/api/v1/whoami", { expect: 200 });
      assert.equal(op.json.role, "operator");
    });
  });

  test("every route of the document was driven to a documented answer", () => {
    const missing = [];
    for (const [t, item] of Object.entries(DOC.paths)) {
      for (const m of Object.keys(item)) {
        const M = m.toUpperCase();
        if (![...covered].some((c) => c.startsWith(`${M} ${t} 2`))) missing.push(`${M} ${t}`);
      }
    }
    assert.deepEqual(missing, [], `never answered with a 2xx: ${missing.join(", ")}`);
  });
});
