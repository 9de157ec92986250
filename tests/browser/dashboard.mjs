// Drives the dashboard in headless Chromium (Debian's, through playwright-core).
// Usage: node dashboard.mjs <admin-url> <admin-token> <screenshot-dir> <user-data-dir>
// Talks with the Rust test over stdio: prints "feed-open" when the live feed is
// showing, waits for a line on stdin once the test has made its calls, prints
// "approved" after clicking Approve, waits for a line again, prints "ok" at the end.
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
  viewport: { width: 1280, height: 800 },
});
const page = context.pages()[0] || await context.newPage();
page.setDefaultTimeout(10000);
const shot = (name) => page.screenshot({ path: path.join(shots, name + ".png"), fullPage: true });
try {
  await page.goto(admin + "/#/feed");
  await page.fill("#token-input", token);
  await page.click("#token button");
  await page.waitForSelector("body[data-feed='live']", { state: "attached" });
  say("feed-open");
  await lines.next();
  await page.waitForSelector("#feed-rows tr >> text=tool_quarantined");
  await page.waitForSelector("#feed-rows tr >> text=forwarded");
  await page.waitForSelector("#feed-rows tr >> text=invalid_arguments");
  await shot("feed");

  // A time window that ends before any call leaves the history empty; the last hour shows them.
  await page.goto(admin + "/#/feed?decision=invalid_arguments&window=60");
  await page.waitForSelector("#feed-rows tr >> text=invalid_arguments");
  const windowed = await page.locator("#feed-rows tr").count();
  const others = await page.locator("#feed-rows tr >> text=forwarded").count();
  if (windowed < 1 || others !== 0) fail(`filtered feed shows ${windowed} rows, ${others} of another decision`);
  await page.goto(admin + "/#/feed");
  await page.waitForSelector("#feed-rows tr >> text=invalid_arguments");

  await page.click("#feed-rows tr a:text('invalid_arguments')");
  await page.waitForSelector("#trace");
  const code = await page.textContent("#result-code");
  if (code !== "invalid_arguments") fail("trace page shows " + code);
  await shot("trace");

  await page.goto(admin + "/#/");
  await page.waitForSelector("#calls-chart rect");
  await shot("overview");
  await page.emulateMedia({ colorScheme: "dark" });
  await shot("overview-dark");
  await page.emulateMedia({ colorScheme: "light" });

  await page.goto(admin + "/#/config");
  await page.waitForSelector("#policy");
  await shot("config");

  await page.goto(admin + "/#/tools");
  const row = page.locator("tr[data-tool='sync_notes']");
  await row.locator("button.approve").waitFor();
  await page.locator("tr[data-tool='sync_notes'] details summary").click();
  const schema = await page.textContent("tr[data-tool='sync_notes'] details pre");
  if (!schema.includes("\"type\"")) fail("the tools page shows no input schema: " + schema);
  await shot("tools");
  await row.locator("button.approve").click();
  await page.waitForSelector("#approve-result:text('approved')");
  const state = await page.textContent("tr[data-tool='sync_notes'] .state");
  if (state !== "trusted") fail("after Approve the tool is " + state);
  say("approved");
  await lines.next();

  await page.setViewportSize({ width: 390, height: 844 });
  await page.goto(admin + "/#/feed");
  await page.waitForSelector("#feed-rows tr");
  await shot("feed-phone");
  await page.goto(admin + "/#/");
  await page.waitForSelector("#calls-chart rect");
  await shot("overview-phone");
  const wide = await page.evaluate(() => document.documentElement.scrollWidth);
  if (wide > 400) fail("the phone-width page scrolls sideways: " + wide + " px");
  say("ok");
} catch (e) {
  await shot("failure").catch(() => {});
  fail(e.stack || String(e));
} finally {
  await context.close();
}
process.exit(0);
