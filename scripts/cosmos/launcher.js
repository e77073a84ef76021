#!/usr/bin/env node
// Test-only launcher around @vercel/cosmosdb-server (pinned in package.json).
//
// lockprobe's Cosmos store tests start this on a loopback port. It serves the
// package's request handler unchanged except for the server bugs that stop the
// Azure Rust SDK (azure_data_cosmos 1.1.0-beta.1) from working against it: the five
// fixes listed in fixes.js (and docs/cosmos.md).
//
// Usage: node launcher.js [--host 127.0.0.1] [--port 0] [--tls]
// Prints one line "LISTENING <port>" on stdout when ready. Exits when stdin closes,
// so a test process that dies without cleaning up does not leave a server behind.

"use strict";

const { createHttpServer, createHttpsServer } = require("@vercel/cosmosdb-server");
const { createFeeds, serveFixed, silenceMissingDocumentCrash } = require("./fixes");

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

function main() {
  silenceMissingDocumentCrash();
  const args = parseArgs(process.argv.slice(2));
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
  process.stdin.on("end", () => process.exit(0));
  process.stdin.on("error", () => process.exit(0));
  process.stdin.resume();
  for (const signal of ["SIGTERM", "SIGINT"]) process.on(signal, () => process.exit(0));
}

main();
