// A DNS rebinding page in headless Chromium (Debian's, through playwright-core),
// with the browser's local-network checks off: the attacker's page is served
// from http://rebind.attacker.test:PORT, whose name then resolves to 127.0.0.1
// (`--host-resolver-rules`), so its same-origin requests reach the gateway's
// listeners with `Host: rebind.attacker.test:PORT`.
// Usage: node rebinding.mjs <admin-port> <mcp-port> <user-data-dir>
// Prints one JSON line: {"attacker": [[what, status, text]...], "local": [...]}.
import { createRequire } from "node:module";

const require = createRequire(process.env.PORTCULLIS_BROWSER_NODE_MODULES + "/");
const { chromium } = require("playwright-core");
const [adminPort, mcpPort, profile] = process.argv.slice(2);
const evil = "rebind.attacker.test";

const context = await chromium.launchPersistentContext(profile, {
  executablePath: "/usr/bin/chromium",
  headless: true,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
    `--host-resolver-rules=MAP ${evil} 127.0.0.1`,
    "--disable-features=PrivateNetworkAccessSendPreflights,PrivateNetworkAccessRespectPreflightResults,BlockInsecurePrivateNetworkRequests,LocalNetworkAccessChecks"],
});
const page = context.pages()[0] || await context.newPage();
page.setDefaultTimeout(10000);

// What a page in `origin` can read of the gateway through same-origin requests.
const probe = async (origin, requests) => {
  // The attacker's own page, as its server would have served it before the rebinding.
  await page.route(origin + "/evil.html", (route) =>
    route.fulfill({ contentType: "text/html", body: "<!doctype html><title>evil</title>" }));
  await page.goto(origin + "/evil.html");
  return page.evaluate(async (requests) => {
    const out = [];
    for (const [method, path, body] of requests) {
      try {
        const r = await fetch(path, { method, body, headers: body ? { "content-type": "application/json" } : {} });
        out.push([method + " " + path, r.status, (await r.text()).slice(0, 300)]);
      } catch (e) {
        out.push([method + " " + path, 0, String(e)]);
      }
    }
    return out;
  }, requests);
};

const adminReads = [
  ["GET", "/api/events"], ["GET", "/api/config"], ["GET", "/api/pins"], ["GET", "/api/overview"],
  ["GET", "/metrics"], ["GET", "/api/reload"], ["POST", "/api/reload"], ["GET", "/"],
];
const mcp = [["POST", "/mcp/demo", JSON.stringify({ jsonrpc: "2.0", id: 1, method: "tools/list" })]];
const result = { attacker: [], local: [] };
try {
  result.attacker.push(...await probe(`http://${evil}:${adminPort}`, adminReads));
  result.attacker.push(...await probe(`http://${evil}:${mcpPort}`, mcp));
  // The dashboard page itself, opened under the rebound name.
  const nav = await page.goto(`http://${evil}:${adminPort}/`);
  result.attacker.push(["navigate /", nav.status(), (await nav.text()).slice(0, 300)]);
  // The same reads from the operator's own page on loopback.
  result.local.push(...await probe(`http://127.0.0.1:${adminPort}`, [["GET", "/api/events"]]));
  process.stdout.write(JSON.stringify(result) + "\n");
} finally {
  await context.close();
}
