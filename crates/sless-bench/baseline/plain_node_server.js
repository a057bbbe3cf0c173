// Baseline for sless-bench: a plain node:http server, outside any sandbox, running a
// function's handler.js the way a hand-written service would. Usage: node plain_node_server.js
// <code dir>. Prints "listening <port>" once it accepts connections on 127.0.0.1.
'use strict';

const http = require('node:http');
const path = require('node:path');

const handler = require(path.resolve(process.argv[2], 'handler.js'));

const server = http.createServer((req, res) => {
  const chunks = [];
  req.on('data', (chunk) => chunks.push(chunk));
  req.on('end', async () => {
    // A minimal event: what a request means to the handler, without the platform's extras.
    const event = { method: req.method, path: req.url, query: {}, headers: {}, body: null };
    let status = 200;
    let body;
    try {
      const result = await handler.handle(event);
      body = JSON.stringify(result === undefined ? null : result);
    } catch (err) {
      status = 500;
      body = JSON.stringify({ error: err && err.message ? err.message : String(err) });
    }
    res.writeHead(status, {
      'content-type': 'application/json',
      'content-length': Buffer.byteLength(body),
    });
    res.end(body);
  });
});

server.listen(0, '127.0.0.1', () => {
  process.stdout.write(`listening ${server.address().port}\n`);
});

function stop() {
  server.close(() => process.exit(0));
  // Keep-alive connections would hold close() open; the bench is done with them.
  server.closeAllConnections();
}
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
