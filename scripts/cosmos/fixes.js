// The fixes the launcher applies around @vercel/cosmosdb-server's request handler so that
// the Azure Rust SDK (azure_data_cosmos 1.1.0-beta.1) works against it; see docs/cosmos.md
// and shared notes cosmos-local.md:
//
//   1. Reading a missing document answers 500 ("Cannot read properties of undefined")
//      instead of 404: rewritten to 404 NotFound.
//   2. Partition key ranges carry a numeric "id"; the SDK's topology loader wants a
//      string and fails with 503/20305: ids are rewritten to strings.
//   3. A query without a partition key header is refused with 400 "missing partition
//      keys" unless it is marked cross-partition: such queries are marked.
//   4. The account document advertises the server's own address, always as https://:
//      rewritten to the scheme served and the host the client asked for (so a test
//      proxy in front of the server stays in the path). The two-region mode
//      (regions.js) supplies its own rewrite instead.
//   5. The change feed is a stub (every read returns every document with ETag "1"):
//      the launcher serves a latest-version change feed itself, from the writes it
//      has seen: each successful create / upsert / replace / patch gets the next
//      sequence number (LSN) of its collection; a read returns the latest version of
//      each document whose LSN is past the `If-None-Match` continuation, in LSN order,
//      up to `x-ms-max-item-count`, with the last LSN as the ETag; 304 when nothing is
//      new. `If-None-Match: *` starts from now. Deletes drop the document (latest-
//      version feeds do not report deletes).
//
// Every function takes the state of one server (`feeds`, or a context `ctx`), so the
// two-region mode can keep one set per region.

"use strict";

const crypto = require("crypto");

const DOC_PATH = /^\/dbs\/[^/]+\/colls\/[^/]+\/docs\/[^/]+$/;
const DOCS_PATH = /^\/dbs\/[^/]+\/colls\/[^/]+\/docs$/;
const PKRANGES_PATH = /^\/dbs\/[^/]+\/colls\/[^/]+\/pkranges$/;
const MISSING_DOC_CRASH = "Cannot read properties of undefined";

// Fix 5 state of one server: collection path -> { lsn, docs: Map(id -> { lsn, doc }) }.
function createFeeds() {
  return new Map();
}

function feedOf(feeds, collectionPath) {
  let feed = feeds.get(collectionPath);
  if (!feed) {
    feed = { lsn: 0, docs: new Map() };
    feeds.set(collectionPath, feed);
  }
  return feed;
}

function collectionOf(path) {
  return path.replace(/\/docs(\/[^/]+)?$/, "");
}

function pathOf(req) {
  return decodeURIComponent((req.url || "/").split("?")[0]).replace(/\/+$/, "") || "/";
}

function isQuery(req) {
  const isQueryHeader = String(req.headers["x-ms-documentdb-isquery"] || "").toLowerCase() === "true";
  const contentType = String(req.headers["content-type"] || "");
  return req.method === "POST" && (isQueryHeader || contentType.startsWith("application/query+json"));
}

function isChangeFeedRead(req) {
  return req.method === "GET" && Boolean(req.headers["a-im"]) && DOCS_PATH.test(pathOf(req));
}

function serveChangeFeed(feeds, req, res) {
  const feed = feedOf(feeds, collectionOf(pathOf(req)));
  const ifNoneMatch = String(req.headers["if-none-match"] || "").replace(/"/g, "").trim();
  const since = ifNoneMatch === "*" ? feed.lsn : parseInt(ifNoneMatch || "0", 10) || 0;
  const max = parseInt(req.headers["x-ms-max-item-count"] || "-1", 10);
  let changes = [...feed.docs.values()].filter(entry => entry.lsn > since).sort((a, b) => a.lsn - b.lsn);
  if (max > 0) changes = changes.slice(0, max);
  res.setHeader("x-ms-request-charge", "1");
  res.setHeader("x-ms-activity-id", crypto.randomUUID());
  res.setHeader("content-type", "application/json");
  if (changes.length === 0) {
    res.statusCode = 304;
    res.setHeader("etag", `"${since}"`);
    res.end();
    return;
  }
  const last = changes[changes.length - 1].lsn;
  const body = JSON.stringify({
    _rid: "",
    Documents: changes.map(entry => ({ ...entry.doc, _lsn: entry.lsn })),
    _count: changes.length
  });
  res.statusCode = 200;
  res.setHeader("etag", `"${last}"`);
  res.setHeader("x-ms-item-count", String(changes.length));
  res.setHeader("content-length", Buffer.byteLength(body));
  res.end(body);
}

// Fix 5: remember every successful document write for the change feed. Returns what
// was recorded ({ lsn, doc } for a write, { deleted: id } for a delete), or null.
function recordWrite(feeds, req, res, text) {
  const path = pathOf(req);
  const isDocWrite =
    (req.method === "POST" && DOCS_PATH.test(path) && !isQuery(req)) ||
    ((req.method === "PUT" || req.method === "PATCH") && DOC_PATH.test(path));
  if (req.method === "DELETE" && DOC_PATH.test(path) && res.statusCode < 300) {
    const id = path.split("/").pop();
    feedOf(feeds, collectionOf(path)).docs.delete(id);
    return { deleted: id };
  }
  if (!isDocWrite || res.statusCode >= 300) return null;
  let doc;
  try {
    doc = JSON.parse(text);
  } catch (_) {
    return null;
  }
  if (!doc || typeof doc.id !== "string") return null;
  const feed = feedOf(feeds, collectionOf(path));
  feed.lsn += 1;
  feed.docs.set(doc.id, { lsn: feed.lsn, doc });
  return { lsn: feed.lsn, doc };
}

// Fix 3: happens before the handler runs.
function fixRequest(req) {
  const path = pathOf(req);
  if (isQuery(req) && DOCS_PATH.test(path) && !req.headers["x-ms-documentdb-partitionkey"]) {
    req.headers["x-ms-documentdb-query-enablecrosspartition"] = "true";
  }
}

// Fix 4 as the single-region launcher applies it: every location is the address the
// client used.
function advertiseHostAsked(req, body, tls) {
  const endpoint = `${tls ? "https" : "http"}://${req.headers.host}/`;
  for (const list of [body.writableLocations, body.readableLocations]) {
    for (const location of list || []) location.databaseAccountEndpoint = endpoint;
  }
}

// Fixes 1, 2 and 4: rewrite the response body the handler produced, before any byte
// is sent (the handler only sets headers and calls end once). `ctx`: { tls, feeds,
// rewriteAccount(req, body)?, onWrite(req, res, text, recorded)? }.
function rewriteResponse(req, res, ctx, chunk) {
  const path = pathOf(req);
  let text = chunk == null ? "" : chunk.toString();
  const recorded = recordWrite(ctx.feeds, req, res, text);
  if (ctx.onWrite) ctx.onWrite(req, res, text, recorded);
  if (req.method === "GET" && DOC_PATH.test(path) && res.statusCode === 500 && text.includes(MISSING_DOC_CRASH)) {
    res.statusCode = 404;
    return JSON.stringify({
      code: "NotFound",
      message: "Entity with the specified id does not exist in the system."
    });
  }
  if (req.method === "GET" && PKRANGES_PATH.test(path) && res.statusCode === 200) {
    try {
      const body = JSON.parse(text);
      for (const range of body.PartitionKeyRanges || []) {
        if (typeof range.id === "number") range.id = String(range.id);
      }
      text = JSON.stringify(body);
    } catch (_) {
      // Not JSON: leave it alone, the client will report it.
    }
    return text;
  }
  if (req.method === "GET" && path === "/" && res.statusCode === 200 && req.headers.host) {
    try {
      const body = JSON.parse(text);
      if (ctx.rewriteAccount) ctx.rewriteAccount(req, body);
      else advertiseHostAsked(req, body, ctx.tls);
      return JSON.stringify(body);
    } catch (_) {
      return text;
    }
  }
  return chunk;
}

// Serves one request through `handler` (the package's, or the two-region mode's) with
// every fix applied.
function serveFixed(handler, ctx, req, res) {
  if (isChangeFeedRead(req)) {
    serveChangeFeed(ctx.feeds, req, res);
    return;
  }
  fixRequest(req);
  const end = res.end.bind(res);
  res.end = (chunk, ...rest) => {
    const body = rewriteResponse(req, res, ctx, chunk);
    if (typeof body === "string") res.setHeader("content-length", Buffer.byteLength(body));
    return end(body, ...rest);
  };
  handler(req, res);
}

// The package logs the missing-document crash it answers with 500; fix 1 turns that
// answer into a 404, so the log line is noise.
function silenceMissingDocumentCrash() {
  const originalConsoleError = console.error;
  console.error = (...args) => {
    const first = args[0];
    const message = first && first.message ? first.message : String(first);
    if (message.includes(MISSING_DOC_CRASH)) return;
    originalConsoleError(...args);
  };
}

module.exports = {
  DOC_PATH,
  DOCS_PATH,
  collectionOf,
  createFeeds,
  feedOf,
  isQuery,
  pathOf,
  serveFixed,
  silenceMissingDocumentCrash
};
