// Drives the Voilà dashboard (notebooks/control_panel.ipynb) in headless Chromium, as a person
// would: wait for the control panel's badge to say `running`, click Pause and see `paused`, click
// Resume and see `running` again, with a screenshot at each stop.
//
//   node dashboard.mjs URL SCREENSHOT_DIR     (CHROMIUM: the browser, default /usr/bin/chromium)
//
// playwright-core drives the system's Chromium (Debian's package); it never downloads a browser.
import { chromium } from 'playwright-core';
import path from 'node:path';

const [url, outDir] = process.argv.slice(2);
const TIMEOUT_MS = 60_000; // the dashboard starts a kernel and runs the notebook first

const args = [
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  // Without these Chromium reaches for the network at start and stalls where there is none.
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
];
if (process.getuid && process.getuid() === 0) args.push('--no-sandbox'); // the sandbox refuses root

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  args,
});
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 1000 } });
  page.setDefaultTimeout(TIMEOUT_MS);
  await page.goto(url);
  const control = page.locator('.electric-entity-control');
  const badge = (state) => control.locator(`.electric-badge[data-state="${state}"]`);

  await badge('running').waitFor();
  await control.locator('button.electric-sigstop').click();
  await badge('paused').waitFor();
  await page.screenshot({ path: path.join(outDir, 'dashboard-paused.png'), fullPage: true });
  await control.locator('button.electric-sigcont').click();
  await badge('running').waitFor();
  await page.screenshot({ path: path.join(outDir, 'dashboard.png'), fullPage: true });
  console.log('dashboard: running → paused → running');
} finally {
  await browser.close();
}
