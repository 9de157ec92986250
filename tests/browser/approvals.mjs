// Drives the dashboard's approval queue in headless Chromium (Debian's, through playwright-core).
// Usage: node approvals.mjs <admin-url> <admin-token> <screenshot-dir> <user-data-dir>
// Talks with the Rust test over stdio: prints "queue-open" when the approvals page shows,
// waits until the held call appears in it, screenshots it, clicks Approve, prints "approved";
// waits for a line on stdin, opens the approval's event, prints "ok" at the end.
import { createRequire } from "node:module";
import { createInterface } from "node:readline";
import path from "node:path";

const require = createRequire(process.env.PORTCULLIS_BROWSER_NODE_MODULES + "/");
const { chromium } = require("playwright-core");
const [admin, token, shots, profile] = process.argv.slice(2);
const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
const say = (s) => process.stdout.write(s + "\n");
const fail = (s) => { console.error("FAIL: " + s); process.exit(1); };

const context = await chromium.launchPersistentContext(profile, {
  executablePath: "/usr/bin/chromium",
  headless: true,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run"],
  viewport: { width: 1280, height: 720 },
});
const page = context.pages()[0] || await context.newPage();
page.setDefaultTimeout(20000);
const shot = (name) => page.screenshot({ path: path.join(shots, name + ".png"), fullPage: true });
try {
  await page.goto(admin + "/#/approvals");
  await page.fill("#token-input", token);
  await page.click("#token button");
  await page.waitForSelector("#approvals");
  say("queue-open");
  const row = page.locator("tr[data-tool='echo']");
  await row.waitFor();
  const args = await row.locator("pre.args").textContent();
  if (!args.includes("drop the staging table\\u{1B}]0;rm -rf /\\u{7}")) fail("the queue shows other arguments: " + args);
  if (/[\u0000-\u0009\u000b-\u001f\u007f-\u009f]/.test(args)) fail("the queue shows an invisible control character: " + JSON.stringify(args));
  const shown = await row.evaluate((r) => r.querySelector("pre.args").innerText);
  if (!shown.includes("\\u{1B}")) fail("the escape is not visible on the page: " + shown);
  const client = await row.locator("td").nth(1).textContent();
  if (client !== "alice") fail("the queue shows the wrong client: " + client);
  await shot("approvals-queue");
  await row.locator("button.approve").click();
  await page.waitForSelector("#decide-result:text('approved')");
  say("approved");
  await lines.next();

  await page.goto(admin + "/#/feed");
  const decided = page.locator("#feed-rows tr a:text-is('approved')").first();
  await decided.waitFor();
  await decided.click();
  await page.waitForSelector("#approval");
  const approval = await page.textContent("#approval");
  if (!approval.includes("operator") || !approval.includes("admin-api")) fail("the trace page shows " + approval);
  await shot("approvals-trace");
  say("ok");
} catch (e) {
  await shot("failure").catch(() => {});
  fail(e.stack || String(e));
} finally {
  await context.close();
}
process.exit(0);
