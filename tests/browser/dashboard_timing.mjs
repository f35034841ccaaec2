// Times the dashboard in headless Chromium, for bench/bench_dashboard.py: how long the page takes
// to show the table's first page, and how long each change of the table takes to show its rows.
//
//   node dashboard_timing.mjs URL PLAN_JSON      (CHROMIUM: the browser, default /usr/bin/chromium)
//
// PLAN_JSON: {"live": N, "type": T, "of_type": N, "search": S, "found": N, "all": N}: the counts the
// table must show at first (live entities), filtered to type T, searched for S (within T), and with
// the final ones shown (every state, type T again cleared). Prints one JSON line of milliseconds.
import { launch, table, tableLoaded } from './browser.mjs';

const [url, planText] = process.argv.slice(2);
const plan = JSON.parse(planText);
const TIMEOUT_MS = 120_000;

// Resolves once the page's first row is of `type` (any type when null) and the table counts `count`.
async function rowsShown(page, count, type) {
  await tableLoaded(page, count);
  await page.waitForFunction((wanted) => {
    const row = [...document.querySelectorAll('.electric-row')].find((r) => r.offsetParent !== null);
    return row !== undefined && (wanted === null || row.querySelector('[data-col="type"]').textContent === wanted);
  }, type);
}

const browser = await launch();
try {
  const page = await browser.newPage({ viewport: { width: 1440, height: 960 } });
  page.setDefaultTimeout(TIMEOUT_MS);
  const timed = async (action, done) => {
    const started = performance.now();
    await action();
    await done();
    return performance.now() - started;
  };
  const out = {};
  let shell = 0;
  out.first_render_ms = await timed(
    () => page.goto(url, { waitUntil: 'commit' }),
    async () => {
      await table(page).waitFor();
      shell = performance.now();
      await rowsShown(page, plan.live, null);
    },
  );
  out.rows_after_table_ms = performance.now() - shell;
  out.dom_elements = await page.evaluate(() => document.getElementsByTagName('*').length);
  const filters = table(page);
  out.type_filter_ms = await timed(
    () => filters.locator('.electric-type-filter select').selectOption({ label: plan.type }),
    () => rowsShown(page, plan.of_type, plan.type),
  );
  out.search_ms = await timed(
    () => filters.locator('.electric-search input').fill(plan.search),
    () => rowsShown(page, plan.found, plan.type),
  );
  await filters.locator('.electric-search input').fill('');
  await filters.locator('.electric-type-filter select').selectOption({ label: 'all types' });
  await rowsShown(page, plan.live, null);
  out.show_final_ms = await timed(
    () => filters.locator('.electric-show-final input[type="checkbox"]').check(),
    () => rowsShown(page, plan.all, null),
  );
  console.log(JSON.stringify(out));
} finally {
  await browser.close();
}
