// A TCP balancer of the test's own, standing where a cluster's Service stands in front of the
// controller's two webhook replicas (docs/reliability.md, "The driver"): as the Service's
// endpoints hold only the replicas whose readiness probe passes, it asks each replica's /readyz
// every 200 ms and sends each connection to the next ready replica in turn (to another one when
// its connect is refused); with none ready it refuses the connection, as a Service without
// endpoints does. TLS passes through untouched (both replicas serve the same certificate), so
// kube-apiserver still authenticates the replica and the replica the API server's client
// certificate.
//   node balancer.mjs LISTEN_PORT WEBHOOK_PORT:HEALTH_PORT...
// Prints "listening PORT" once it accepts; runs until killed.
import http from "node:http";
import net from "node:net";

const [listen, ...specs] = process.argv.slice(2);
const listenPort = Number(listen);
const backends = specs.map((spec) => {
  const [port, health] = spec.split(":").map(Number);
  return { port, health, ready: false };
});
if (!Number.isInteger(listenPort) || backends.length === 0 ||
    backends.some((b) => !(b.port > 0) || !(b.health > 0))) {
  console.error("usage: node balancer.mjs LISTEN_PORT WEBHOOK_PORT:HEALTH_PORT...");
  process.exit(2);
}

// The readiness probe: 200 from /readyz within 1 s.
function probe(backend) {
  const request = http.get({ host: "127.0.0.1", port: backend.health, path: "/readyz", timeout: 1000 },
    (response) => {
      backend.ready = response.statusCode === 200;
      response.resume();
    });
  request.on("timeout", () => request.destroy());
  request.on("error", () => { backend.ready = false; });
}
setInterval(() => backends.forEach(probe), 200);
backends.forEach(probe);

let next = 0;
// connect(client, order): the first backend of `order` that takes the connection; the client is
// closed when none does.
function connect(client, order) {
  if (order.length === 0) {
    client.destroy();
    return;
  }
  const [backend, ...rest] = order;
  const upstream = net.connect({ host: "127.0.0.1", port: backend.port });
  let connected = false;
  upstream.once("connect", () => {
    connected = true;
    client.pipe(upstream);
    upstream.pipe(client);
    client.resume();
  });
  upstream.on("error", () => {
    if (!connected) connect(client, rest);
    else client.destroy();
  });
  // A replica that ends its connection after an answer (`Connection: close`) ends the client's
  // the same way, after the answer is written: destroy() would drop what is still buffered, as no
  // Service's NAT does. A broken upstream breaks the client's too.
  upstream.on("close", (hadError) => connected && (hadError ? client.destroy() : client.end()));
  client.on("close", () => upstream.destroy());
}

const server = net.createServer({ pauseOnConnect: true }, (client) => {
  client.on("error", () => {});
  const start = next;
  next = (next + 1) % backends.length;
  const order = [];
  for (let i = 0; i < backends.length; ++i) {
    const backend = backends[(start + i) % backends.length];
    if (backend.ready) order.push(backend);
  }
  connect(client, order);
});
server.listen(listenPort, "127.0.0.1", () => console.log(`listening ${server.address().port}`));
