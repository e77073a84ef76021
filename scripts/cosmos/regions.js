// Two-region mode of the launcher (`node launcher.js --regions "West Europe,North Europe"`):
// ONE Cosmos DB account with a single write region, served by one HTTP listener per
// region. See docs/cosmos-regions.md for what it is faithful to and what it is not.
//
// Design: each region holds its own instance of the package's data model (an
// `Account` from @vercel/cosmosdb-server/lib/account, driven by the package's own
// routes), so a region answers only from what it has. Writes are accepted by the write
// region alone; every committed write there is captured from the response (the package
// answers a write with the stored resource, `_etag`, `_ts`, `_rid` and all) and copied
// into every other region by a replicator:
//
//   - document create / upsert / replace / patch / delete: queued, in commit order, and
//     applied when `commit time + replication lag` has passed (the lag is read at apply
//     time, so changing it at runtime moves every pending write);
//   - database and container create / replace / delete: applied to every region at once
//     (metadata is not lagged; see the docs for why).
//
// A replica gets the very object the write region stored (same `_etag`, `_ts`, `_rid`,
// `_self`) and the same change-feed LSN, so it serves the same version identity.
//
// Writes reaching a region that is not the write region (or any region while a planned
// failover is draining) are refused the way Cosmos DB refuses a write to a read region:
// 403 with `x-ms-substatus: 3` (WriteForbidden). The check and the commit happen in one
// turn of the event loop (the request body is read first), so a failover can never
// slip in between them.
//
// The account document (GET / on any region) lists the current write region under
// `writableLocations` and every region (write region first) under `readableLocations`,
// each with its own endpoint; its `_etag` changes with every failover.
//
// A control listener (a separate port the SDK never calls) drives it:
//   GET  /_lockprobe/status
//   POST /_lockprobe/lag?ms=N                       (or ?lag=2s)
//   POST /_lockprobe/failover?mode=planned|forced[&to=Region]
// A planned failover stops writes in the old write region at once, waits until the
// new write region has applied every pending write (at the current lag), then switches.
// A forced failover switches at once: writes the new write region had not applied are
// lost (listed in the status as `lostWrites`), and every other region is re-seeded from
// the new write region, as a region coming back after a forced failover is.

"use strict";

const crypto = require("crypto");
const fs = require("fs");
const http = require("http");
const https = require("https");
const path = require("path");

const Account = require("@vercel/cosmosdb-server/lib/account").default;
const routes = require("@vercel/cosmosdb-server/lib/routes").default;
const jsonModule = require("@vercel/cosmosdb-server/lib/json");
const { parsePartitionKey } = require("@vercel/cosmosdb-server/lib/utils/get-partition-from-header");
const { collectionOf, createFeeds, feedOf, isQuery, pathOf, serveFixed } = require("./fixes");

const PACKAGE_DIR = path.dirname(require.resolve("@vercel/cosmosdb-server/package.json"));
const STATUS_PENDING_LIMIT = 200;
const LOST_WRITES_LIMIT = 10000;

const DBS = /^\/dbs$/;
const DB = /^\/dbs\/([^/]+)$/;
const COLLS = /^\/dbs\/([^/]+)\/colls$/;
const COLL = /^\/dbs\/([^/]+)\/colls\/([^/]+)$/;
const DOCS = /^\/dbs\/([^/]+)\/colls\/([^/]+)\/docs$/;
const DOC = /^\/dbs\/([^/]+)\/colls\/([^/]+)\/docs\/([^/]+)$/;

// The package's handlers read the request body themselves (`await json(req)`), which
// would let other requests (a failover among them) run between a region's write check
// and the commit. Here the body is read before the check, and the handlers are given
// it without waiting on the stream again; the module's export is looked up at call
// time by every handler, so replacing it here reaches them all.
const readJsonFromStream = jsonModule.default;
jsonModule.default = async req =>
  req.lockprobeBody !== undefined ? JSON.parse(req.lockprobeBody.toString()) : readJsonFromStream(req);

/** `2s`, `500ms`, `1.5s`, `1m`, or a bare number of milliseconds. */
function parseDuration(text) {
  const match = /^\s*(\d+(?:\.\d+)?)\s*(ms|s|m)?\s*$/.exec(String(text));
  if (!match) return null;
  const value = parseFloat(match[1]);
  const unit = match[2] || "ms";
  return Math.round(value * { ms: 1, s: 1000, m: 60000 }[unit]);
}

function normaliseRegion(name) {
  return String(name).toLowerCase().replace(/\s+/g, "");
}

function readBody(req) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    req.on("data", chunk => chunks.push(chunk));
    req.on("end", () => resolve(Buffer.concat(chunks)));
    req.on("error", reject);
  });
}

function isBatch(req) {
  return String(req.headers["x-ms-cosmos-is-batch-request"] || "").toLowerCase() === "true";
}

function isUpsert(req) {
  return String(req.headers["x-ms-documentdb-is-upsert"] || "").toLowerCase() === "true";
}

function isWrite(req) {
  if (req.method === "POST") return !isQuery(req);
  return req.method === "PUT" || req.method === "PATCH" || req.method === "DELETE";
}

function hostOnly(hostHeader) {
  const host = String(hostHeader || "127.0.0.1");
  if (host.startsWith("[")) return host.slice(0, host.indexOf("]") + 1);
  return host.split(":")[0];
}

function partitionOf(req, id) {
  try {
    return parsePartitionKey(req.headers["x-ms-documentdb-partitionkey"], id);
  } catch (_) {
    return id;
  }
}

const QUERY_METRICS =
  "totalExecutionTimeInMs=0.00;queryCompileTimeInMs=0.00;queryLogicalPlanBuildTimeInMs=0.00;" +
  "queryPhysicalPlanBuildTimeInMs=0.00;queryOptimizationTimeInMs=0.00;VMExecutionTimeInMs=0.00;" +
  "indexLookupTimeInMs=0.00;documentLoadTimeInMs=0.00;systemFunctionExecuteTimeInMs=0.00;" +
  "userFunctionExecuteTimeInMs=0.00;retrievedDocumentCount=0;retrievedDocumentSize=0;outputDocumentCount=1;" +
  "outputDocumentSize=0;writeOutputTimeInMs=0.00;indexUtilizationRatio=0.00";

// The package's request handler (lib/index.js generateRequestHandler, not exported),
// for one region's account: the same answers, headers and all.
function packageHandler(account) {
  return (req, res) => {
    const route = routes(req);
    (async () => {
      let body;
      if (route) {
        const [params, handler] = route;
        try {
          body = await handler(account, req, res, params);
        } catch (err) {
          console.error(err);
          body = { message: err.message };
          res.statusCode = 500;
        }
        if (res.statusCode > 399 && !body.message) body.message = "";
      } else {
        res.statusCode = 400;
        body = { message: "no route" };
      }
      if (body && body._etag) res.setHeader("etag", body._etag);
      res.setHeader("content-type", "application/json");
      res.setHeader("content-location", `https://${req.headers.host}${req.url}`);
      res.setHeader("connection", "close");
      res.setHeader("x-ms-activity-id", crypto.randomUUID());
      res.setHeader("x-ms-request-charge", "1");
      if (req.headers["x-ms-documentdb-populatequerymetrics"]) {
        res.setHeader("x-ms-documentdb-query-metrics", QUERY_METRICS);
      }
      // Incremental reads (the SDK's partition key range feed): the package's stub
      // answers 304 with ETag 1 once the client has a continuation.
      if (req.headers["a-im"] && res.statusCode === 200) {
        if (req.headers["if-none-match"]) res.statusCode = 304;
        res.setHeader("etag", "1");
      }
      res.end(JSON.stringify(body));
    })().catch(err => {
      console.error(err);
      if (!res.finished) {
        res.statusCode = 500;
        res.end("");
      }
    });
  };
}

// --- copying the package's data model between regions ------------------------------

/** Puts `data` (a stored resource, system fields and all) into `items` as it is. */
function putItem(items, data, ridCount) {
  const copy = structuredClone(data);
  const partition = items._getPartition(copy);
  if (items._item("/id", copy.id, partition).read()) items.delete(copy.id, partition);
  items._set(copy);
  items._ridCount = Math.max(items._ridCount, ridCount || 0);
  return items._data.get(copy._rid);
}

function deleteItem(items, id, partition) {
  if (items._item("/id", id, partition).read()) items.delete(id, partition);
}

function clearItems(items) {
  items._data.clear();
  items._index.clear();
  items._ridCount = 0;
}

function copyItems(source, target, each) {
  for (const item of source._data.values()) {
    const copy = putItem(target, item.read(), 0);
    if (each) each(item, copy);
  }
  target._ridCount = source._ridCount;
}

/** The partition key ranges of a container, as the source region created them. */
function copyPartitionKeyRanges(sourceCollection, targetCollection) {
  clearItems(targetCollection.partitionKeyRanges);
  copyItems(sourceCollection.partitionKeyRanges, targetCollection.partitionKeyRanges);
}

/** A deep copy of a whole account (user-defined functions are not copied). */
function cloneAccount(source, host, port) {
  const target = new Account(host, port);
  copyItems(source.databases, target.databases, (sourceDb, targetDb) =>
    copyItems(sourceDb.collections, targetDb.collections, (sourceColl, targetColl) => {
      copyPartitionKeyRanges(sourceColl, targetColl);
      copyItems(sourceColl.documents, targetColl.documents);
    })
  );
  return target;
}

// --- the account -------------------------------------------------------------------

class Regions {
  constructor(args) {
    this.host = args.host;
    this.tls = args.tls;
    this.scheme = args.tls ? "https" : "http";
    this.lagMs = args.replicationLagMs;
    this.regions = args.regions.map(name => ({
      name,
      port: 0,
      server: null,
      account: new Account(args.host, 0),
      feeds: createFeeds(),
      queue: [],
      applied: 0,
      appliedSeq: 0,
      skipped: 0
    }));
    this.write = 0;
    this.generation = 1;
    this.seq = 0;
    this.switching = null;
    this.failovers = [];
    this.lostWrites = [];
    this.lostWritesTotal = 0;
    this.notReplicated = 0;
    this.timer = null;
    this.waiters = [];
  }

  get writeRegion() {
    return this.regions[this.write];
  }

  acceptsWrites(region) {
    return region === this.writeRegion && !this.switching;
  }

  endpointOf(region, req, asked) {
    if (region === asked && req && req.headers.host) return `${this.scheme}://${req.headers.host}/`;
    const host = req ? hostOnly(req.headers.host) : this.host;
    return `${this.scheme}://${host}:${region.port}/`;
  }

  // Fix 4 for this mode: one account, its write region and every readable region
  // (write region first, then the others in the order given), each at its own
  // endpoint. The region asked is advertised at the address the client used.
  rewriteAccount(asked, req, body) {
    const order = [this.writeRegion, ...this.regions.filter(r => r !== this.writeRegion)];
    const location = region => ({ name: region.name, databaseAccountEndpoint: this.endpointOf(region, req, asked) });
    body.writableLocations = [location(this.writeRegion)];
    body.readableLocations = order.map(location);
    body.enableMultipleWriteLocations = false;
    body._etag = `"lockprobe-topology-${this.generation}"`;
  }

  async onRequest(region, req, res) {
    let body;
    try {
      body = await readBody(req);
    } catch (_) {
      res.destroy();
      return;
    }
    req.lockprobeBody = body;
    // From here to the commit, nothing else runs: the check below holds for the write.
    if (isWrite(req) && !this.acceptsWrites(region)) {
      this.refuseWrite(req, res);
      return;
    }
    if (isWrite(req) && isBatch(req)) {
      sendJson(res, 400, {
        code: "BadRequest",
        message: "transactional batches are not replicated by the lockprobe two-region launcher"
      });
      return;
    }
    const ctx = {
      tls: this.tls,
      feeds: region.feeds,
      rewriteAccount: (r, b) => this.rewriteAccount(region, r, b),
      onWrite: (r, s, text, recorded) => {
        try {
          this.onCommitted(region, r, s, text, recorded);
        } catch (err) {
          process.stderr.write(`launcher: cannot replicate ${r.method} ${r.url}: ${err.stack || err}\n`);
        }
      }
    };
    serveFixed(packageHandler(region.account), ctx, req, res);
  }

  // What Cosmos DB answers a write sent to a region that does not take writes.
  refuseWrite(req, res) {
    const activityId = crypto.randomUUID();
    const message =
      'Message: {"Errors":["The requested operation cannot be performed at this region"]}\r\n' +
      `ActivityId: ${activityId}, Request URI: ${req.url}`;
    res.setHeader("x-ms-substatus", "3");
    res.setHeader("x-ms-activity-id", activityId);
    res.setHeader("x-ms-request-charge", "0");
    sendJson(res, 403, { code: "Forbidden", message });
  }

  // Called (by the fixes layer) for every response, before it is sent, in the same
  // turn of the event loop as the write it answers.
  onCommitted(region, req, res, text, recorded) {
    if (!isWrite(req) || res.statusCode >= 300) return;
    if (region !== this.writeRegion) {
      process.stderr.write(`launcher: a write committed in read region ${region.name}: ${req.method} ${req.url}\n`);
      return;
    }
    const p = pathOf(req);
    const body = () => JSON.parse(text);
    const others = this.regions.filter(r => r !== region);
    let m;
    if (req.method === "POST" && DBS.test(p)) {
      const data = body();
      for (const r of others) putItem(r.account.databases, data, region.account.databases._ridCount);
    } else if (req.method === "DELETE" && (m = DB.exec(p))) {
      for (const r of others) deleteItem(r.account.databases, m[1], m[1]);
    } else if ((req.method === "POST" && (m = COLLS.exec(p))) || (req.method === "PUT" && (m = COLL.exec(p)))) {
      const data = body();
      const source = region.account.database(m[1]);
      for (const r of others) {
        const db = r.account.database(m[1]);
        if (!db.read()) continue;
        const target = putItem(db.collections, data, source.collections._ridCount);
        copyPartitionKeyRanges(source.collection(data.id), target);
      }
    } else if (req.method === "DELETE" && (m = COLL.exec(p))) {
      for (const r of others) {
        const db = r.account.database(m[1]);
        if (db.read()) deleteItem(db.collections, m[2], m[2]);
      }
    } else if ((m = DOCS.exec(p)) || (m = DOC.exec(p))) {
      this.enqueueDocument(region, req, p, m, text, recorded);
    } else {
      this.notReplicated += 1;
    }
    this.pump();
  }

  enqueueDocument(region, req, p, m, text, recorded) {
    const [, db, coll, pathId] = m;
    const collection = region.account.database(db).collection(coll);
    const event = {
      seq: (this.seq += 1),
      from: region.name,
      db,
      coll,
      collPath: collectionOf(p),
      collRid: (collection.read() || {})._rid,
      ridCount: collection.documents._ridCount,
      committedAt: Date.now()
    };
    if (req.method === "DELETE") {
      Object.assign(event, { op: "delete", id: pathId, partition: partitionOf(req, pathId), etag: null, ts: null });
    } else {
      const data = JSON.parse(text);
      const op = req.method === "PUT" ? "replace" : req.method === "PATCH" ? "patch" : isUpsert(req) ? "upsert" : "create";
      Object.assign(event, { op, id: data.id, data, etag: data._etag, ts: data._ts, lsn: recorded ? recorded.lsn : 0 });
    }
    for (const r of this.regions) if (r !== region) r.queue.push(event);
  }

  applyDocument(region, event) {
    const collection = region.account.database(event.db).collection(event.coll);
    const data = collection.read();
    if (!data || data._rid !== event.collRid) {
      region.skipped += 1;
      return;
    }
    const items = collection.documents;
    const feed = feedOf(region.feeds, event.collPath);
    if (event.op === "delete") {
      deleteItem(items, event.id, event.partition);
      feed.docs.delete(event.id);
    } else {
      putItem(items, event.data, event.ridCount);
      feed.lsn = Math.max(feed.lsn, event.lsn);
      feed.docs.set(event.id, { lsn: event.lsn, doc: structuredClone(event.data) });
    }
    region.applied += 1;
    region.appliedSeq = event.seq;
  }

  /** Applies every pending write whose time has come, and schedules the next. */
  pump() {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    const now = Date.now();
    let next = Infinity;
    for (const region of this.regions) {
      while (region.queue.length > 0 && region.queue[0].committedAt + this.lagMs <= now) {
        this.applyDocument(region, region.queue.shift());
      }
      if (region.queue.length > 0) next = Math.min(next, region.queue[0].committedAt + this.lagMs);
    }
    if (next !== Infinity) this.timer = setTimeout(() => this.pump(), Math.max(1, next - now));
    this.waiters = this.waiters.filter(waiter => {
      if (!waiter.done()) return true;
      waiter.resolve();
      return false;
    });
  }

  until(done) {
    if (done()) return Promise.resolve();
    return new Promise(resolve => this.waiters.push({ done, resolve }));
  }

  setLag(ms) {
    this.lagMs = ms;
    this.pump();
  }

  async failover(mode, toName) {
    if (mode !== "planned" && mode !== "forced") throw httpError(400, `mode must be planned or forced, not ${mode}`);
    if (this.switching) throw httpError(409, `a planned failover to ${this.switching.to} is in progress`);
    const from = this.writeRegion;
    let to;
    if (toName) {
      to = this.regions.find(r => normaliseRegion(r.name) === normaliseRegion(toName));
      if (!to) throw httpError(400, `no region ${toName}`);
    } else {
      to = this.regions[(this.write + 1) % this.regions.length];
    }
    if (to === from) throw httpError(400, `${to.name} is already the write region`);
    const requestedAt = Date.now();
    let lost = [];
    if (mode === "planned") {
      this.switching = { mode, from: from.name, to: to.name, startedAt: new Date(requestedAt).toISOString() };
      try {
        await this.until(() => to.queue.length === 0);
      } finally {
        this.switching = null;
      }
      this.write = this.regions.indexOf(to);
    } else {
      lost = to.queue.splice(0);
      this.write = this.regions.indexOf(to);
      for (const region of this.regions) {
        if (region === to) continue;
        region.account = cloneAccount(to.account, this.host, region.port);
        region.feeds = structuredClone(to.feeds);
        region.queue = [];
      }
      this.lostWritesTotal += lost.length;
      for (const event of lost) {
        if (this.lostWrites.length < LOST_WRITES_LIMIT) this.lostWrites.push(summary(event, to.name, this.lagMs));
      }
    }
    this.generation += 1;
    const record = {
      mode,
      from: from.name,
      to: to.name,
      requestedAt: new Date(requestedAt).toISOString(),
      completedAt: new Date().toISOString(),
      tookMs: Date.now() - requestedAt,
      lostWrites: lost.length
    };
    this.failovers.push(record);
    this.pump();
    return record;
  }

  status() {
    const pending = [];
    for (const region of this.regions) {
      for (const event of region.queue) {
        if (pending.length >= STATUS_PENDING_LIMIT) break;
        pending.push(summary(event, region.name, this.lagMs));
      }
    }
    return {
      writeRegion: this.writeRegion.name,
      switching: this.switching,
      replicationLagMs: this.lagMs,
      committedSeq: this.seq,
      regions: this.regions.map(region => ({
        name: region.name,
        endpoint: `${this.scheme}://${this.host}:${region.port}/`,
        role: region === this.writeRegion ? "write" : "read",
        acceptsWrites: this.acceptsWrites(region),
        pending: region.queue.length,
        applied: region.applied,
        appliedSeq: region.appliedSeq,
        skipped: region.skipped
      })),
      pending,
      failovers: this.failovers,
      lostWrites: this.lostWrites,
      lostWritesTotal: this.lostWritesTotal,
      notReplicated: this.notReplicated
    };
  }

  async onControl(req, res) {
    const url = new URL(req.url || "/", "http://control");
    try {
      await readBody(req);
      if (req.method === "GET" && url.pathname === "/_lockprobe/status") {
        sendJson(res, 200, this.status());
      } else if (req.method === "POST" && url.pathname === "/_lockprobe/lag") {
        const raw = url.searchParams.get("ms") ?? url.searchParams.get("lag");
        const ms = url.searchParams.has("ms") ? parseDuration(`${raw}ms`) : parseDuration(raw);
        if (ms === null) throw httpError(400, `bad lag ${JSON.stringify(raw)}: give ?ms=N or ?lag=2s`);
        this.setLag(ms);
        sendJson(res, 200, this.status());
      } else if (req.method === "POST" && url.pathname === "/_lockprobe/failover") {
        const record = await this.failover(url.searchParams.get("mode") || "planned", url.searchParams.get("to"));
        sendJson(res, 200, { failover: record, status: this.status() });
      } else {
        throw httpError(404, `no control endpoint ${req.method} ${url.pathname}`);
      }
    } catch (err) {
      sendJson(res, err.status || 500, { error: err.message });
    }
  }

  listen(port, controlPort) {
    const options = {
      cert: fs.readFileSync(path.join(PACKAGE_DIR, "cert.pem")),
      key: fs.readFileSync(path.join(PACKAGE_DIR, "key.pem")),
      minVersion: "TLSv1"
    };
    const serve = listener => (this.tls ? https.createServer(options, listener) : http.createServer(listener));
    const listenOn = (server, wanted) =>
      new Promise((resolve, reject) => {
        server.once("error", reject);
        server.listen(wanted, this.host, () => resolve(server.address().port));
      });
    const started = this.regions.map(async (region, i) => {
      region.server = serve((req, res) => this.onRequest(region, req, res));
      region.port = await listenOn(region.server, port === 0 ? 0 : port + i);
    });
    const control = http.createServer((req, res) => this.onControl(req, res));
    return Promise.all([...started, listenOn(control, controlPort)]).then(ports => ports[ports.length - 1]);
  }
}

function summary(event, region, lagMs) {
  return {
    seq: event.seq,
    op: event.op,
    from: event.from,
    to: region,
    db: event.db,
    coll: event.coll,
    id: event.id,
    etag: event.etag,
    ts: event.ts,
    committedAt: new Date(event.committedAt).toISOString(),
    dueAt: new Date(event.committedAt + lagMs).toISOString()
  };
}

function httpError(status, message) {
  const err = new Error(message);
  err.status = status;
  return err;
}

function sendJson(res, status, body) {
  const text = JSON.stringify(body);
  res.statusCode = status;
  res.setHeader("content-type", "application/json");
  res.setHeader("content-length", Buffer.byteLength(text));
  res.end(text);
}

/** Starts every region and the control listener; resolves to what READY reports. */
async function startRegions(args) {
  const account = new Regions(args);
  const control = await account.listen(args.port, args.controlPort);
  return {
    account,
    ready: {
      control,
      replicationLagMs: account.lagMs,
      writeRegion: account.writeRegion.name,
      regions: account.regions.map(r => ({ name: r.name, port: r.port }))
    }
  };
}

module.exports = { normaliseRegion, parseDuration, startRegions };
