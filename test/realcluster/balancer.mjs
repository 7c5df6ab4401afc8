// A TCP balancer of the chaos test's own, standing where a cluster's Service stands in front of
// the controller's two webhook replicas (docs/reliability.md, "The driver"): each connection goes
// to the next replica in turn, and to the other one when its connect is refused, as kube-proxy's
// endpoints drop a replica that is down. TLS passes through untouched (both replicas serve the
// same certificate), so kube-apiserver still authenticates the replica and the replica the API
// server's client certificate.
//   node balancer.mjs LISTEN_PORT BACKEND_PORT...
// Prints "listening PORT" once it accepts; runs until killed.
import net from "node:net";

const [listenPort, ...backends] = process.argv.slice(2).map(Number);
if (!Number.isInteger(listenPort) || backends.length === 0 || backends.some((p) => !(p > 0))) {
  console.error("usage: node balancer.mjs LISTEN_PORT BACKEND_PORT...");
  process.exit(2);
}

let next = 0;
// connect(client, tried, start): the next backend not tried yet, from the client's turn start;
// the client is closed when none answers.
function connect(client, tried, start) {
  if (tried >= backends.length) {
    client.destroy();
    return;
  }
  const port = backends[(start + tried) % backends.length];
  const upstream = net.connect({ host: "127.0.0.1", port });
  let connected = false;
  upstream.once("connect", () => {
    connected = true;
    client.pipe(upstream);
    upstream.pipe(client);
    client.resume();
  });
  upstream.on("error", () => {
    if (!connected) connect(client, tried + 1, start);
    else client.destroy();
  });
  upstream.on("close", () => connected && client.destroy());
  client.on("close", () => upstream.destroy());
}

const server = net.createServer({ pauseOnConnect: true }, (client) => {
  client.on("error", () => {});
  const start = next;
  next = (next + 1) % backends.length;
  connect(client, 0, start);
});
server.listen(listenPort, "127.0.0.1", () => console.log(`listening ${server.address().port}`));
