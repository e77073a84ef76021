#!/usr/bin/env node
// Test-only launcher around @vercel/cosmosdb-server (pinned in package.json).
//
// lockprobe's Cosmos store tests start this on a loopback port. It serves the
// package's request handler unchanged except for the server bugs that stop the
// Azure Rust SDK (azure_data_cosmos 1.1.0-beta.1) from working against it; see
// docs/cosmos.md and shared notes cosmos-local.md:
//
//   1. Reading a missing document answers 500 ("Cannot read properties of undefined")
//      instead of 404: rewritten to 404 NotFound.
//   2. Partition key ranges carry a numeric "id"; the SDK's topology loader wants a
//      string and fails with 503/20305: ids are rewritten to strings.
//   3. A query without a partition key header is refused with 400 "missing partition
//      keys" unless it is marked cross-partition: such queries are marked.
//   4. The account document advertises the server's own address, always as https://:
//      rewritten to the scheme served and the host the client asked for (so a test
//      proxy in front of the server stays in the path).
//   5. The change feed is a stub (every read returns every document with ETag "1"):
//      the launcher serves a latest-version change feed itself, from the writes it
//      has seen: each successful create / upsert / replace / patch gets the next
//      sequence number (LSN) of its collection; a read returns the latest version of
//      each document whose LSN is past the `If-None-Match` continuation, in LSN order,
//      up to `x-ms-max-item-count`, with the last LSN as the ETag; 304 when nothing is
//      new. `If-None-Match: *` starts from now. Deletes drop the document (latest-
//      version feeds do not report deletes).
//
// Usage: node launcher.js [--host 127.0.0.1] [--port 0] [--tls]
// Prints one line "LISTENING <port>" on stdout when ready. Exits when stdin closes,
// so a test process that dies without cleaning up does not leave a server behind.

"use strict";

const { createHttpServer, createHttpsServer } = require("@vercel/cosmosdb-server");

function parseArgs(argv) {
  const args = { host: "127.0.0.1", port: 0, tls: false };
  for (let i = 0; i < argv.length; i += 1) {
    const key = argv[i];
    if (key === "--host") args.host = argv[++i];
    else if (key === "--port") args.port = parseInt(argv[++i], 10);
    else if (key === "--tls") args.tls = true;
    else {
      process.stderr.write(`launcher: unknown argument ${key}\n`);
      process.exit(64);
    }
  }
  if (!Number.isInteger(args.port) || args.port < 0 || args.port > 65535) {
    process.stderr.write("launcher: --port must be an integer in 0..65535\n");
    process.exit(64);
  }
  return args;
}

const DOC_PATH = /^\/dbs\/[^/]+\/colls\/[^/]+\/docs\/[^/]+$/;
const DOCS_PATH = /^\/dbs\/[^/]+\/colls\/[^/]+\/docs$/;
const PKRANGES_PATH = /^\/dbs\/[^/]+\/colls\/[^/]+\/pkranges$/;
const MISSING_DOC_CRASH = "Cannot read properties of undefined";

// Fix 5 state: collection path -> { lsn, docs: Map(id -> { lsn, doc }) }.
const feeds = new Map();

function feedOf(collectionPath) {
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

function isChangeFeedRead(req) {
  return req.method === "GET" && Boolean(req.headers["a-im"]) && DOCS_PATH.test(pathOf(req));
}

function serveChangeFeed(req, res) {
  const feed = feedOf(collectionOf(pathOf(req)));
  const ifNoneMatch = String(req.headers["if-none-match"] || "").replace(/"/g, "").trim();
  const since = ifNoneMatch === "*" ? feed.lsn : parseInt(ifNoneMatch || "0", 10) || 0;
  const max = parseInt(req.headers["x-ms-max-item-count"] || "-1", 10);
  let changes = [...feed.docs.values()].filter(entry => entry.lsn > since).sort((a, b) => a.lsn - b.lsn);
  if (max > 0) changes = changes.slice(0, max);
  res.setHeader("x-ms-request-charge", "1");
  res.setHeader("x-ms-activity-id", require("crypto").randomUUID());
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

// Fix 5: remember every successful document write for the change feed.
function recordWrite(req, res, text) {
  const path = pathOf(req);
  const isDocWrite =
    (req.method === "POST" && DOCS_PATH.test(path) && !isQuery(req)) ||
    ((req.method === "PUT" || req.method === "PATCH") && DOC_PATH.test(path));
  if (req.method === "DELETE" && DOC_PATH.test(path) && res.statusCode < 300) {
    const id = path.split("/").pop();
    feedOf(collectionOf(path)).docs.delete(id);
    return;
  }
  if (!isDocWrite || res.statusCode >= 300) return;
  let doc;
  try {
    doc = JSON.parse(text);
  } catch (_) {
    return;
  }
  if (!doc || typeof doc.id !== "string") return;
  const feed = feedOf(collectionOf(path));
  feed.lsn += 1;
  feed.docs.set(doc.id, { lsn: feed.lsn, doc });
}

function pathOf(req) {
  return decodeURIComponent((req.url || "/").split("?")[0]).replace(/\/+$/, "") || "/";
}

function isQuery(req) {
  const isQueryHeader = String(req.headers["x-ms-documentdb-isquery"] || "").toLowerCase() === "true";
  const contentType = String(req.headers["content-type"] || "");
  return req.method === "POST" && (isQueryHeader || contentType.startsWith("application/query+json"));
}

// Fix 3: happens before the handler runs.
function fixRequest(req) {
  const path = pathOf(req);
  if (isQuery(req) && DOCS_PATH.test(path) && !req.headers["x-ms-documentdb-partitionkey"]) {
    req.headers["x-ms-documentdb-query-enablecrosspartition"] = "true";
  }
}

// Fixes 1, 2 and 4: rewrite the response body the handler produced, before any byte
// is sent (the handler only sets headers and calls end once).
function rewriteResponse(req, res, tls, chunk) {
  const path = pathOf(req);
  let text = chunk == null ? "" : chunk.toString();
  recordWrite(req, res, text);
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
      const endpoint = `${tls ? "https" : "http"}://${req.headers.host}/`;
      for (const list of [body.writableLocations, body.readableLocations]) {
        for (const location of list || []) location.databaseAccountEndpoint = endpoint;
      }
      return JSON.stringify(body);
    } catch (_) {
      return text;
    }
  }
  return chunk;
}

// The package logs the missing-document crash it answers with 500; fix 1 turns that
// answer into a 404, so the log line is noise.
const originalConsoleError = console.error;
console.error = (...args) => {
  const first = args[0];
  const message = first && first.message ? first.message : String(first);
  if (message.includes(MISSING_DOC_CRASH)) return;
  originalConsoleError(...args);
};

function main() {
  const args = parseArgs(process.argv.slice(2));
  const server = args.tls ? createHttpsServer() : createHttpServer();
  const [handler] = server.listeners("request");
  server.removeAllListeners("request");
  server.on("request", (req, res) => {
    if (isChangeFeedRead(req)) {
      serveChangeFeed(req, res);
      return;
    }
    fixRequest(req);
    const end = res.end.bind(res);
    res.end = (chunk, ...rest) => {
      const body = rewriteResponse(req, res, args.tls, chunk);
      if (typeof body === "string") res.setHeader("content-length", Buffer.byteLength(body));
      return end(body, ...rest);
    };
    handler(req, res);
  });
  server.on("error", err => {
    process.stderr.write(`launcher: ${err.message}\n`);
    process.exit(1);
  });
  server.listen(args.port, args.host, () => {
    process.stdout.write(`LISTENING ${server.address().port}\n`);
  });
  process.stdin.on("end", () => process.exit(0));
  process.stdin.on("error", () => process.exit(0));
  process.stdin.resume();
  for (const signal of ["SIGTERM", "SIGINT"]) process.on(signal, () => process.exit(0));
}

main();
