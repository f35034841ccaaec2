// The system's Chromium (Debian's package), headless, as the browser tests and the dashboard bench
// launch it; playwright-core drives it and never downloads a browser.
import { chromium } from 'playwright-core';

const ARGS = [
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  // Without these Chromium reaches for the network at start and stalls where there is none.
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
];

// A fresh profile each time (playwright's launch makes one); the sandbox refuses root.
export async function launch() {
  const args = [...ARGS];
  if (process.getuid && process.getuid() === 0) args.push('--no-sandbox');
  return chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    args,
  });
}

// The dashboard's pieces, by the classes the widgets give them.
export const table = (page) => page.locator('.electric-entity-table');
export const panel = (page) => page.locator('.electric-entity-control');
export const rowIds = (page) => table(page).locator('button.electric-open:visible');

// Resolves once the table's summary no longer says "loading…" and counts `count` entities
// (any count when none is given).
export async function tableLoaded(page, count) {
  await page.waitForFunction((wanted) => {
    const summary = document.querySelector('.electric-summary');
    if (!summary) return false;
    const text = summary.textContent;
    if (text.includes('loading')) return false;
    const match = text.match(/^([\d,]+) entit/);
    return match !== null && (wanted === undefined || Number(match[1].replace(/,/g, '')) === wanted);
  }, count);
}
