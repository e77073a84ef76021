#!/usr/bin/env node
// Test-only launcher around @vercel/cosmosdb-server (pinned in package.json).
//
// lockprobe's Cosmos store tests start this on a loopback port. It serves the
// package's request handler unchanged except for the server bugs that stop the
// Azure Rust SDK (azure_data_cosmos 1.1.0-beta.1) from working against it: the five
// fixes listed in fixes.js (and docs/cosmos.md).
//
// Usage: node launcher.js [--host 127.0.0.1] [--port 0] [--tls]
// Prints one line "LISTENING <port>" on stdout when ready.
//
// Two-region mode (regions.js, docs/cosmos-regions.md):
//   node launcher.js --regions "West Europe,North Europe" [--replication-lag 2s]
//                    [--control-port 0] [--host 127.0.0.1] [--port 0] [--tls]
// One account, the first region its write region, one listener per region (--port P
// gives the regions P, P+1, ...; 0 takes free ports) and a control listener. Prints one
// line "READY <json>" on stdout when ready, the JSON being
//   {"control":<port>,"replicationLagMs":<ms>,"writeRegion":"<name>",
//    "regions":[{"name":"<name>","port":<port>},...]}.
//
// Either way it exits when stdin closes, so a test process that dies without cleaning
// up does not leave a server behind.

"use strict";

const { createHttpServer, createHttpsServer } = require("@vercel/cosmosdb-server");
const { createFeeds, serveFixed, silenceMissingDocumentCrash } = require("./fixes");

function usage(message) {
  process.stderr.write(`launcher: ${message}\n`);
  process.exit(64);
}

function parseArgs(argv) {
  const args = { host: "127.0.0.1", port: 0, tls: false, regions: null, replicationLag: null, controlPort: 0 };
  for (let i = 0; i < argv.length; i += 1) {
    const key = argv[i];
    if (key === "--host") args.host = argv[++i];
    else if (key === "--port") args.port = parseInt(argv[++i], 10);
    else if (key === "--tls") args.tls = true;
    else if (key === "--regions") args.regions = String(argv[++i]);
    else if (key === "--replication-lag") args.replicationLag = String(argv[++i]);
    else if (key === "--control-port") args.controlPort = parseInt(argv[++i], 10);
    else usage(`unknown argument ${key}`);
  }
  for (const [flag, port] of [["--port", args.port], ["--control-port", args.controlPort]]) {
    if (!Number.isInteger(port) || port < 0 || port > 65535) usage(`${flag} must be an integer in 0..65535`);
  }
  if (args.regions === null) {
    if (args.replicationLag !== null || args.controlPort !== 0) usage("--replication-lag and --control-port need --regions");
    return args;
  }
  const { normaliseRegion, parseDuration } = require("./regions");
  args.regions = args.regions.split(",").map(name => name.trim()).filter(Boolean);
  const distinct = new Set(args.regions.map(normaliseRegion));
  if (args.regions.length < 2 || distinct.size !== args.regions.length) {
    usage("--regions needs at least two distinct comma-separated region names");
  }
  args.replicationLagMs = parseDuration(args.replicationLag === null ? "0" : args.replicationLag);
  if (args.replicationLagMs === null) usage("--replication-lag takes 2s, 500ms, 1m or a number of milliseconds");
  return args;
}

function exitWithParent() {
  process.stdin.on("end", () => process.exit(0));
  process.stdin.on("error", () => process.exit(0));
  process.stdin.resume();
  for (const signal of ["SIGTERM", "SIGINT"]) process.on(signal, () => process.exit(0));
}

function mainRegions(args) {
  const { startRegions } = require("./regions");
  startRegions(args).then(
    ({ ready }) => process.stdout.write(`READY ${JSON.stringify(ready)}\n`),
    err => {
      process.stderr.write(`launcher: ${err.message}\n`);
      process.exit(1);
    }
  );
  exitWithParent();
}

function main() {
  silenceMissingDocumentCrash();
  const args = parseArgs(process.argv.slice(2));
  if (args.regions) {
    mainRegions(args);
    return;
  }
  const server = args.tls ? createHttpsServer() : createHttpServer();
  const [handler] = server.listeners("request");
  server.removeAllListeners("request");
  const ctx = { tls: args.tls, feeds: createFeeds() };
  server.on("request", (req, res) => serveFixed(handler, ctx, req, res));
  server.on("error", err => {
    process.stderr.write(`launcher: ${err.message}\n`);
    process.exit(1);
  });
  server.listen(args.port, args.host, () => {
    process.stdout.write(`LISTENING ${server.address().port}\n`);
  });
  exitWithParent();
}

main();
