// Drives the Voilà dashboard (notebooks/control_panel.ipynb) in headless Chromium along the path a
// person takes: the fleet, a filter, a row opened, a run interrupted, a stop counted down to
// `stopped`, the final entities shown. A screenshot at each step; their paths are printed.
//
//   node dashboard.mjs URL SCREENSHOT_DIR     (CHROMIUM: the browser, default /usr/bin/chromium)
//
// Two steps need the test's hand, asked for on stdout and given on stdin: "need run" (it starts a
// run that holds, then answers "go") and "countdown seen" (it lets the held cleanup finish).
import path from 'node:path';
import readline from 'node:readline';
import { launch, panel, rowIds, table, tableLoaded } from './browser.mjs';

const [url, outDir] = process.argv.slice(2);
const TIMEOUT_MS = 60_000; // the dashboard starts a kernel and runs the notebook first
const stdin = readline.createInterface({ input: process.stdin });
const answers = stdin[Symbol.asyncIterator]();

async function ask(question) {
  console.log(question);
  const { value } = await answers.next();
  if (value !== 'go') throw new Error(`asked "${question}", got ${JSON.stringify(value)}`);
}

const browser = await launch();
try {
  const page = await browser.newPage({ viewport: { width: 1440, height: 960 } });
  page.setDefaultTimeout(TIMEOUT_MS);
  let step = 0;
  const shot = async (name) => {
    step += 1;
    const file = path.join(outDir, `dashboard-${String(step).padStart(2, '0')}-${name}.png`);
    await page.screenshot({ path: file, fullPage: true });
    console.log(`screenshot ${file}`);
  };

  // 1. It opens on the fleet: live entities of every type, none stopped or killed.
  await page.goto(url);
  await tableLoaded(page);
  await table(page).locator('.electric-badge[data-state="spawning"]').first().waitFor();
  await shot('fleet');

  // 2. Filter: one type, one state.
  await table(page).locator('.electric-type-filter select').selectOption({ label: 'probe' });
  await table(page).locator('.electric-state-filter select').selectOption({ label: 'running' });
  await page.waitForFunction(() => {
    const rows = [...document.querySelectorAll('.electric-row')].filter((r) => r.offsetParent !== null);
    return rows.length > 0 && rows.every((r) => r.querySelector('[data-col="type"]').textContent === 'probe'
      && r.querySelector('.electric-badge').dataset.state === 'running');
  });
  await shot('filtered');

  // 3. Open a row: its control panel beside the table.
  await rowIds(page).filter({ hasText: /^b1$/ }).click();
  const badge = (state) => panel(page).locator(`.electric-badge[data-state="${state}"]`);
  await badge('running').waitFor();
  await shot('opened');

  // 4. Interrupt the run in progress.
  await ask('need run');
  const interrupt = panel(page).locator('button.electric-sigint:not([disabled])');
  await interrupt.click();
  await panel(page).locator('.electric-log', { hasText: /run\s+\S+\s+\S+ aborted/ }).waitFor();
  await shot('interrupted');

  // 5. Stop it: the grace countdown, then `stopped`, final.
  await panel(page).locator('button.electric-sigterm').click();
  await badge('stopping').waitFor();
  await panel(page).locator('.electric-note', { hasText: 'grace ends in' }).waitFor();
  await shot('stopping');
  await ask('countdown seen');
  await badge('stopped').waitFor();
  await panel(page).locator('.electric-final', { hasText: 'final' }).waitFor();
  await shot('stopped');

  // 6. Show the final entities: every state again, stopped and killed too.
  await table(page).locator('.electric-state-filter select').selectOption({ label: 'any state' });
  await table(page).locator('.electric-show-final input[type="checkbox"]').check();
  await table(page).locator('.electric-badge[data-state="killed"]').first().waitFor();
  await table(page).locator('.electric-badge[data-state="stopped"]').first().waitFor();
  await tableLoaded(page);
  await shot('final-shown');
  console.log('dashboard: fleet → filtered → opened → interrupted → stopping → stopped → final shown');
} finally {
  stdin.close(); // else the open stdin keeps Node running
  await browser.close();
}
